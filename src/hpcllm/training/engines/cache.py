"""The experiment's dataset index cache, built on a CPU job before any GPU job starts.

Megatron-LM builds its document, sample and shuffle indices on rank 0 of the first GPU
job while every other rank waits (on large data this times out: Megatron-LM issues 907,
1355, 795). The ``prepare_data_cache`` rule builds them instead with Megatron Core's
``BlendedMegatronDatasetBuilder``, as Megatron-LM's ``tools/prepare_cache`` does, from the
experiment's blend, split, sequence length, seed and sample counts, into the folder every
segment passes as ``--data-cache-path``; the segments then only load them.

Megatron Core names the cached files by an MD5 of the dataset's identity, which includes
the tokenizer's ``unique_identifiers``: for the megatron engine those of the tokenizer
Megatron-LM's ``build_tokenizer`` makes from the segment's flags (at the pin, Megatron
Core's text tokenizer with its path and keyword arguments), for the torch engine its own
vocabulary key. A key that differs from Megatron's makes the GPU job build the index
itself: tests/training/test_megatron_conformance.py checks it with Megatron-LM's own code.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

from hpcllm.atomic import atomic_path

# The Megatron-LM commit MegatronTokenizerKey was last verified against, and the digest of
# the key's format then (tokenizer_key_format_digest). Moving the pin (megatron_args.
# MEGATRON_LM_COMMIT) or changing the key fails tests/training/test_megatron_tokenizer_key.py
# until both are re-verified together: Megatron-LM's newest commit at the time of writing
# (d98e8a64, 2026-08-22) names the class megatron.core.tokenizers.text.text_tokenizer.
# MegatronTokenizerText (its #6622 dropped DefaultTokenizerText) and adds use_gigatoken
# (#6514), so with this key its GPU jobs would rebuild every index instead of loading it.
MEGATRON_TOKENIZER_KEY_VERIFIED = ("5be9626709af2722333bf54797c954c09edeada3", "b54fffbfee819ef4")


class MegatronTokenizerKey:
    """What Megatron Core reads of the tokenizer pretrain_gpt.py builds from the segment's
    flags (Megatron-LM's ``build_tokenizer`` at the pin, default values of the flags we do
    not set): its identity, vocabulary size and end-of-document id. The identity is
    Megatron Core's own (``megatron_tokenizer_identity``) for the library, path and
    keyword arguments ``build_tokenizer`` passes; the tokenizer itself is not loaded.

    ``tokenizer_model``: the folder given as ``--tokenizer-model`` to
    ``HuggingFaceTokenizer`` (``command.megatron_tokenizer_model``; the workflow never
    generates another tokenizer type for a dataset)."""

    def __init__(self, tokenizer_model: str, vocab_size: int, eod: int):
        # build_tokenizer's keyword arguments, in its order (the identity keeps it)
        kwargs = {"chat_template": None, "vocab_file": None, "merges_file": None,
                  "additional_special_tokens": [], "use_fast": True,
                  "trust_remote_code": False, "include_special_tokens": True}  # fmt: skip
        self.unique_identifiers = megatron_tokenizer_identity(
            "huggingface", tokenizer_model, kwargs
        )
        self.vocab_size = vocab_size
        self.eod = eod
        self.special_tokens_dict: dict = {}


def megatron_tokenizer_identity(library: str, path: str, kwargs: dict) -> OrderedDict:
    """The ``unique_identifiers`` of the text tokenizer Megatron Core's
    ``MegatronTokenizer.from_pretrained(path, {"library": library}, **kwargs)`` makes, from
    Megatron Core's own code without loading the tokenizer: the class its
    ``_get_tokenizer_model_class`` picks, and that class's ``unique_identifiers`` (the
    class's qualified name, the path and every keyword argument as text, in order)."""
    from megatron.core.tokenizers import megatron_tokenizer

    cls = megatron_tokenizer._get_tokenizer_model_class(library, {"library": library})
    shell = cls.__new__(cls)  # what its __init__ would keep, without the tokenizer
    shell.path = path
    shell.additional_args = dict(kwargs)
    return OrderedDict(shell.unique_identifiers)


def tokenizer_key_format_digest() -> str:
    """A digest of MegatronTokenizerKey's identity (names, order, values) for a fixed
    tokenizer folder: what Megatron Core's cache file names hash (its MD5 of the
    dataset's unique identifiers, in order)."""
    keys = [MegatronTokenizerKey("TOKENIZER_FOLDER", 0, 0)]
    text = json.dumps([list(k.unique_identifiers.items()) for k in keys])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@contextlib.contextmanager
def _one_process_group():
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def built_with(engine: str) -> dict[str, str]:
    """The Megatron Core that built a cache, and for the megatron engine the Megatron-LM
    that loads it (the same release: hpcllm.models.megatron_compat)."""
    from megatron.core import package_info

    from hpcllm.models.megatron_args import MEGATRON_LM_COMMIT, MEGATRON_LM_RELEASE

    made = {"megatron_core": package_info.__shortversion__}
    if engine == "megatron":
        made["loaded_by"] = f"Megatron-LM {MEGATRON_LM_RELEASE} ({MEGATRON_LM_COMMIT[:12]})"
    return made


def build_index_cache(prepared, folder: str | os.PathLike, manifest: str | os.PathLike) -> dict:
    """Build (or find complete) the index files of ``prepared``; write ``manifest``."""
    from hpcllm.text.tokenizers_config import engine_vocabulary
    from hpcllm.training.engines.command import megatron_tokenizer_model
    from hpcllm.training.plan.data import build_datasets
    from hpcllm.training.plan.data_checks import check_segment_data, dataset_samples

    check_segment_data(prepared)
    exp = prepared.experiment
    vocab_size, eod = engine_vocabulary(prepared.tokenizer_files, prepared.eod_token)
    tokenizer = None  # the torch engine's key
    if exp["engine"] == "megatron":
        tokenizer = MegatronTokenizerKey(
            megatron_tokenizer_model(prepared.tokenizer_files), vocab_size, eod
        )
    samples = dataset_samples(prepared)
    with _one_process_group():  # Megatron Core asks the rank before it writes the cache
        datasets = build_datasets(
            prepared.blend,
            exp["data"]["split"],
            exp["model"]["seq_length"],
            exp["seed"],
            samples,
            vocab_size,
            eod,
            folder,
            tokenizer=tokenizer,
        )
    files = sorted(p.name for p in Path(folder).iterdir() if p.is_file())
    record: dict[str, Any] = {
        "engine": exp["engine"],
        "samples": dict(zip(("train", "valid", "test"), samples)),
        "built": [len(d) if d is not None else 0 for d in datasets],
        "files": files,
        **built_with(exp["engine"]),
    }
    # No timings here (results/timings/prepare_data_cache/ has them): the manifest is data,
    # identical between identical runs.
    with atomic_path(manifest) as tmp:
        tmp.write_text(json.dumps(record, indent=2) + "\n")
    return record
