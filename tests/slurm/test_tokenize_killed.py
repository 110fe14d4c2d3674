"""A tokenize job cancelled mid-shard leaves no output that looks finished; a rerun heals."""

from __future__ import annotations

import random
import time
from pathlib import Path

import orjson
import pytest
import slurmruns
from support import hang_guard

pytestmark = pytest.mark.slurm

SHARD = "data/tokenized/sample_bpe/big/0000_text_document"
# One large local source tokenized with the (slower) reference encoder in small batches,
# so the job writes its .bin for several seconds; the tokenizer trains on the small
# sample only.
CONFIG = """
text:
  sources:
    big: {type: local, files: big.jsonl, shards: 1}
  tokenizers:
    sample_bpe: {type: train, vocab_size: 8000, sample_documents: 2000, sources: [sample_en]}
  tokenize: {tokenizers: [sample_bpe], encoder: hf, batch_bytes: 65536}
"""


def write_corpus(path: Path, documents: int = 5000, seed: int = 0) -> None:
    """About 11 MB of word salad from a fixed seed: the same bytes on every run."""
    rng = random.Random(seed)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        for _ in range(5000)
    ]
    with open(path, "wb") as f:
        for i in range(documents):
            text = " ".join(rng.choices(words, k=rng.randint(200, 500)))
            f.write(orjson.dumps({"id": str(i), "text": text}) + b"\n")


def prepare(workdir: Path) -> Path:
    slurmruns.make_workdir(workdir)
    write_corpus(workdir / "big.jsonl")
    (workdir / "big.yaml").write_text(CONFIG)
    return workdir


def test_cancelled_tokenize_leaves_no_partial_output_and_rerun_gives_same_bytes(cluster, tmp_path):
    work = prepare(tmp_path / "slurm")
    targets = ("--configfile", "big.yaml", "--", f"{SHARD}.bin", f"{SHARD}.idx")
    log = work / "snakemake.out"
    proc = slurmruns.start(work, cluster, *targets, log=log)
    try:
        job = cluster.wait_job(
            lambda j: j["comment"].startswith("rule_tokenize") and j["state"] == "RUNNING",
            timeout=hang_guard(15),  # submitted and started: ~15 s quiet
        )
        partial = work / f"{SHARD}.bin.incomplete"
        deadline = time.monotonic() + hang_guard(3)  # first bytes: ~3 s quiet
        while not (partial.exists() and partial.stat().st_size > 0):
            assert time.monotonic() < deadline, "tokenize never started writing its .bin"
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
        cluster.run("scancel", job["id"])
        returncode = proc.wait(timeout=hang_guard(15))  # the plugin sees it: ~15 s quiet
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert returncode != 0, output[-3000:]
    # Snakemake names the failed rule, its Slurm job and the Slurm log.
    assert "Error in rule tokenize" in output
    assert f"SLURM-job '{job['id']}' failed" in output, output[-3000:]
    assert f"slurm_logs/rule_tokenize/big/0000/sample_bpe/{job['id']}.log" in output or (
        f"{job['id']}.log" in output
    )
    state = {j["id"]: j["state"] for j in cluster.jobs()}[job["id"]]
    assert state == "CANCELLED"
    assert not (work / f"{SHARD}.bin").exists() and not (work / f"{SHARD}.idx").exists()
    assert not (work / f"{SHARD}.manifest.json").exists()

    slurmruns.run(work, cluster, *targets)
    assert not list((work / SHARD).parent.glob("*.incomplete"))

    reference = prepare(tmp_path / "local")
    slurmruns.run(reference, None, *targets, profile="local")
    for ext in (".bin", ".idx"):
        assert (work / f"{SHARD}{ext}").read_bytes() == (reference / f"{SHARD}{ext}").read_bytes()
