"""The megatron engine's index cache key: the tokenizer identity Megatron Core computes.

Megatron Core (the jobs' release, as installed) builds the tokenizer here as
Megatron-LM's ``build_tokenizer`` does for the segment's flags; its ``unique_identifiers``
are part of the cache files' names, and its EOD id comes from the folder's
tokenizer_config.json. (The pinned Megatron-LM's own code runs the same check end to end
in test_megatron_conformance.py: its dataset construction loads the cache.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, hang_guard, megatron_hf_tokenizer

from hpcllm.text.tokenizer_train import train_bpe
from hpcllm.training.engines.cache import MegatronTokenizerKey
from hpcllm.training.engines.command import megatron_tokenizer_model
from hpcllm.training.plan.experiment import Paths


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
    key = MegatronTokenizerKey(folder, len(vocab), vocab["<|endoftext|>"])
    assert key.unique_identifiers == real.unique_identifiers
    # Megatron's EOD (from tokenizer_config.json's eos_token) is the workflow's EOD
    assert real.eod == key.eod == vocab["<|endoftext|>"]


# Megatron Core's tokenizer, built as Megatron-LM's build_tokenizer builds it for a
# --tokenizer-type (argv[1]: HuggingFaceTokenizer with --tokenizer-model argv[2], or
# GPT2BPETokenizer with --vocab-file argv[2] --merge-file argv[3]), in a process of its own
# (HF_HOME is read when huggingface_hub is imported); prints its vocabulary size, EOD and
# the ids of each text read as JSON from stdin, or the error.
BUILD_TOKENIZER = """
import json, sys
from megatron.core.tokenizers import MegatronTokenizer
common = dict(additional_special_tokens=[], use_fast=True, trust_remote_code=False,
              include_special_tokens=True)
try:
    if sys.argv[1] == "HuggingFaceTokenizer":
        tok = MegatronTokenizer.from_pretrained(
            tokenizer_path=sys.argv[2], metadata_path={"library": "huggingface"},
            chat_template=None, vocab_file=None, merges_file=None, **common)
    else:
        tok = MegatronTokenizer.from_pretrained(
            tokenizer_path="GPT2BPETokenizer", metadata_path={"library": "megatron"},
            vocab_file=sys.argv[2], merges_file=sys.argv[3], **common)
    texts = json.load(sys.stdin)
    print(json.dumps({"vocab_size": tok.vocab_size, "eod": tok.eod,
                      "ids": [tok.tokenize(t) for t in texts]}))
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
"""


def megatron_tokenizer(hf_home, *args, texts=()) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", BUILD_TOKENIZER, *map(str, args)],
        input=json.dumps(list(texts)),
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"},
        check=True,
        timeout=hang_guard(60),
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def gpt2_snapshot(hf_home) -> None:
    """A gpt2 snapshot in ``hf_home``'s hub cache with another vocabulary (95 tokens)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    repo = hf_home / "hub/models--gpt2"
    snapshot = repo / "snapshots/0000"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs/main").write_text("0000")
    vocab = {"<|endoftext|>": 0, **{chr(c): i + 1 for i, c in enumerate(range(33, 127))}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.save(str(snapshot / "tokenizer.json"))
    (snapshot / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (snapshot / "tokenizer_config.json").write_text('{"tokenizer_class": "GPT2Tokenizer"}')


def test_given_gpt2_files_reach_megatron_as_a_folder_whatever_hf_home_holds(trained, tmp_path):
    """A type: files tokenizer given as GPT-2 vocab and merges files: Megatron gets the
    tokenizer_folder rule's folder (HuggingFaceTokenizer, offline), whose ids are those
    tokenize wrote, even with a gpt2 snapshot of another vocabulary in HF_HOME. Megatron's
    GPT2BPETokenizer with the same files takes that snapshot's vocabulary instead, and
    without it fails offline: what the workflow no longer generates."""
    from hpcllm.text.tokenizers_config import (
        engine_files,
        engine_vocabulary,
        tokenizer_for,
        write_hf_folder,
    )
    from hpcllm.training.engines.command import engine_command

    vocab, merges = str(trained / "vocab.json"), str(trained / "merges.txt")
    cfg = {"type": "files", "vocab_file": vocab, "merges_file": merges,
           "eod_token": "<|endoftext|>"}  # fmt: skip
    files = engine_files("given", cfg)
    assert files == ("data/tokenizers/given/hf/tokenizer.json",
                     "data/tokenizers/given/hf/tokenizer_config.json")  # fmt: skip
    assert megatron_tokenizer_model(files) == "data/tokenizers/given/hf"
    folder = write_hf_folder(cfg, [vocab, merges], tmp_path / "hf")
    hf_home = tmp_path / "hf_home"
    gpt2_snapshot(hf_home)
    texts = [f"the quick brown fox {i} jumps<|endoftext|>" for i in range(3)]
    texts += ["Größe, été 🚀\tspaces  and\nnewlines", "<|endoftext|> inside text", ""]
    ours = tokenizer_for(cfg, [vocab, merges])  # what tokenize encodes with
    expected = [ours.encode(t).ids for t in texts]
    size, eod = engine_vocabulary(
        (str(folder / "tokenizer.json"), str(folder / "tokenizer_config.json")), "<|endoftext|>"
    )
    real = megatron_tokenizer(hf_home, "HuggingFaceTokenizer", folder, texts=texts)
    assert real == {"vocab_size": size, "eod": eod, "ids": expected}
    assert size == len(json.loads(Path(vocab).read_text()))
    # the hazard: GPT2BPETokenizer reads the snapshot, not the files it is given
    hub = megatron_tokenizer(hf_home, "GPT2BPETokenizer", vocab, merges, texts=texts)
    assert hub["vocab_size"] == 95 != size
    offline = megatron_tokenizer(tmp_path / "empty", "GPT2BPETokenizer", vocab, merges)
    assert "Unable to instantiate HuggingFace AutoTokenizer for gpt2" in offline["error"]
    # and the segment's command line names the folder, never GPT2BPETokenizer
    prepared = prepared_with(cfg, tmp_path)
    argv = engine_command(
        prepared.experiment, prepared.layout, prepared.blend, prepared.tokenizer_files,
        Paths("c", "s.json", "s.log", "cache", "tb"), 1, None,
    )  # fmt: skip
    at = argv.index("--tokenizer-type")
    assert argv[at : at + 4] == [
        "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "data/tokenizers/given/hf"
    ]  # fmt: skip
    assert "GPT2BPETokenizer" not in argv and "--vocab-file" not in argv


def prepared_with(tokenizer: dict, workdir):
    """config/examples/local.yaml's tiny_local as a megatron experiment on JUWELS, with
    ``tokenizer`` as its tokenizer ``given``."""
    import yaml
    from snakemake.utils import validate

    from hpcllm.clusters import load_cluster
    from hpcllm.training.plan.experiment import prepare_experiment

    config = yaml.safe_load((REPO / "config/examples/local.yaml").read_text())
    config["text"]["tokenizers"]["given"] = tokenizer
    config["text"]["tokenize"]["tokenizers"] = ["given"]
    for section in ("text", "training"):
        validate(config[section], str(REPO / f"workflow/schemas/{section}.schema.yaml"))
    raw = {**config["training"]["experiments"]["tiny_local"], "engine": "megatron"}
    raw["data"] = {**raw["data"], "tokenizer": "given"}
    clusters = REPO / "config/clusters"
    return prepare_experiment("exp", raw, config["text"], load_cluster("juwels", clusters))


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
