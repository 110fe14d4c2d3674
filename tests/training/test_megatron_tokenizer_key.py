"""The megatron engine's index cache key: the tokenizer identity Megatron Core computes.

Megatron Core (the jobs' release, as installed) builds the tokenizer here as
Megatron-LM's ``build_tokenizer`` does for the segment's flags; its ``unique_identifiers``
are part of the cache files' names, and its EOD id comes from the folder's
tokenizer_config.json. (The pinned Megatron-LM's own code runs the same check end to end
in test_megatron_conformance.py: its dataset construction loads the cache.)
"""

from __future__ import annotations

import json

import pytest
from support import megatron_hf_tokenizer

from hpcllm.text.tokenizer_train import train_bpe
from hpcllm.training.engines.cache import MegatronTokenizerKey
from hpcllm.training.engines.command import megatron_tokenizer_model


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    shard = folder / "shard.jsonl"
    shard.write_text(
        "".join(json.dumps({"text": f"the quick brown fox {i} jumps"}) + "\n" for i in range(50))
    )
    out = folder / "sample_bpe"
    train_bpe([shard], out, vocab_size=300, special_tokens=["<|endoftext|>"])
    return out


def test_the_key_is_megatron_cores_own_identity_of_the_tokenizer(trained):
    files = (str(trained / "vocab.json"), str(trained / "merges.txt"))
    folder = megatron_tokenizer_model(files)
    assert folder == str(trained)  # tokenizer.json and an eos_token: HuggingFaceTokenizer
    # what Megatron-LM's build_tokenizer passes for HuggingFaceTokenizer --tokenizer-model
    real = megatron_hf_tokenizer(folder)
    vocab = json.loads((trained / "vocab.json").read_text())
    key = MegatronTokenizerKey(folder, *files, len(vocab), vocab["<|endoftext|>"])
    assert key.unique_identifiers == real.unique_identifiers
    # Megatron's EOD (from tokenizer_config.json's eos_token) is the workflow's EOD
    assert real.eod == key.eod == vocab["<|endoftext|>"]


def test_without_an_eos_token_megatron_gets_the_gpt2_tokenizer(trained, tmp_path):
    for name in ("vocab.json", "merges.txt", "tokenizer.json"):
        (tmp_path / name).write_bytes((trained / name).read_bytes())
    files = (str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    assert megatron_tokenizer_model(files) is None  # no tokenizer_config.json
    (tmp_path / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "PreTrainedTokenizerFast"}'
    )
    assert megatron_tokenizer_model(files) is None  # one without eos_token
    key = MegatronTokenizerKey(None, *files, 300, 0)
    assert key.unique_identifiers["tokenizer_path"] == "GPT2BPETokenizer"
    assert key.unique_identifiers["vocab_file"] == files[0]


def test_a_given_tokenizer_that_would_need_the_hub_is_named_at_plan_time(trained, tmp_path):
    from hpcllm.training.engines.command import hub_tokenizer_warning

    for name in ("vocab.json", "merges.txt"):
        (tmp_path / name).write_bytes((trained / name).read_bytes())
    files = (str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    given = {"type": "files", "vocab_file": files[0], "merges_file": files[1]}
    warning = hub_tokenizer_warning("exp", "megatron", given, files, "<|endoftext|>")
    assert f"training.experiments.exp: {tmp_path} has no tokenizer.json" in warning
    assert "HF_HUB_OFFLINE=1" in warning and '"eos_token": "<|endoftext|>"' in warning
    assert hub_tokenizer_warning("exp", "torch", given, files, "<|endoftext|>") is None
    assert hub_tokenizer_warning("exp", "megatron", {"type": "train"}, files, "x") is None
    for name in ("tokenizer.json", "tokenizer_config.json"):  # as the warning says
        (tmp_path / name).write_bytes((trained / name).read_bytes())
    assert hub_tokenizer_warning("exp", "megatron", given, files, "<|endoftext|>") is None


def test_the_key_was_verified_at_the_pinned_megatron_lm():
    """Megatron-LM's tokenizer identity changes between commits (at its newest commit
    when this was written: another class name and a use_gigatoken entry): a pin moved
    without re-verifying the key would make every GPU job rebuild the index silently."""
    from hpcllm.models.megatron_args import MEGATRON_LM_COMMIT
    from hpcllm.training.engines.cache import (
        MEGATRON_TOKENIZER_KEY_VERIFIED,
        tokenizer_key_format_digest,
    )

    verified, digest = MEGATRON_TOKENIZER_KEY_VERIFIED
    now = (MEGATRON_LM_COMMIT, tokenizer_key_format_digest())
    assert (verified, digest) == now, (
        f"hpcllm.training.engines.cache.MegatronTokenizerKey was verified at Megatron-LM "
        f"{verified[:12]} (key format {digest}); now the pin is {MEGATRON_LM_COMMIT[:12]} and "
        f"the key format {now[1]}. Re-verify the key against the pinned Megatron-LM: "
        f"git -C Megatron-LM archive {MEGATRON_LM_COMMIT} | tar -x -C DIR; then "
        "MEGATRON_LM_DIR=DIR pytest tests/training/test_megatron_conformance.py -k index_cache "
        "(scripts/megatron_lm_parser.py datasets loads the cache prepare_data_cache built and "
        "must build nothing); change MegatronTokenizerKey until it passes, then record "
        f"MEGATRON_TOKENIZER_KEY_VERIFIED = {now!r} in hpcllm/training/engines/cache.py"
    )


def test_the_manifest_names_the_release_that_built_and_loads_the_cache():
    from hpcllm.models.megatron_args import MEGATRON_LM_COMMIT, MEGATRON_LM_RELEASE
    from hpcllm.models.megatron_compat import MEGATRON_CORE
    from hpcllm.training.engines.cache import built_with

    assert built_with("megatron") == {
        "megatron_core": MEGATRON_CORE,
        "loaded_by": f"Megatron-LM {MEGATRON_LM_RELEASE} ({MEGATRON_LM_COMMIT[:12]})",
    }
    assert built_with("torch") == {"megatron_core": MEGATRON_CORE}
