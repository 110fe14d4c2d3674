"""Many shards in one Slurm job (a whole-node site's tokenize_batch): the shards run side
by side, a failed shard leaves the others, and the rerun redoes it alone."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import slurmruns
from test_tokenize_killed import write_corpus

from hpcllm.text.shard_pool import overlapping, read_record

pytestmark = pytest.mark.slurm

TOK = "data/tokenized/sample_bpe"
MERGED = f"{TOK}/big_text_document"
SHARDS = ("0000", "0001", "0002", "0003")
# As on a site where every job holds a whole node (auto there: cores / 4 per job): two
# shards per job here (the test cluster's nodes have 8 CPUs, 4 threads per shard).
CONFIG = """
text:
  sources:
    big: {{type: local, files: "big/*.jsonl", shards: 4}}
  tokenizers:
    sample_bpe: {{type: train, vocab_size: 8000, sample_documents: 2000, sources: [sample_en]}}
  tokenize: {{tokenizers: [sample_bpe], shards_per_job: {n}}}
"""


def prepare(workdir: Path, shards_per_job: int) -> Path:
    slurmruns.make_workdir(workdir)
    # One file per shard (each shard reads its own file, in place).
    write_corpus(workdir / "big.jsonl", documents=2000)
    lines = (workdir / "big.jsonl").read_bytes().splitlines(keepends=True)
    (workdir / "big").mkdir()
    for k in range(4):
        (workdir / f"big/part-{k}.jsonl").write_bytes(b"".join(lines[k * 500 : (k + 1) * 500]))
    (workdir / "big.jsonl").unlink()
    (workdir / "big.yaml").write_text(CONFIG.format(n=shards_per_job))
    return workdir


def stat(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns


def test_one_jobs_shards_overlap_and_a_failed_shard_reruns_alone(cluster, tmp_path):
    work = prepare(tmp_path / "slurm", 2)
    args = ("--configfile", "big.yaml", "--")
    # Shard 0001's file (read in place) as a .zst cut short: its tokenize fails.
    import zstandard

    bad = work / "big/part-1.jsonl"
    good = bad.read_bytes()
    bad.write_bytes(zstandard.ZstdCompressor().compress(good)[: len(good) // 8])

    first = slurmruns.run(work, cluster, *args, f"{MERGED}.bin", check=False)
    out = first.stdout + first.stderr
    assert first.returncode != 0, out[-3000:]
    assert "Error in rule tokenize_batch" in out, out[-3000:]
    batch0 = (work / "logs/tokenize_batch/sample_bpe/big/batch0000.log").read_text()
    assert "shard 0001: exit code 1, log logs/tokenize/sample_bpe/big/0001.log" in batch0, batch0
    assert "truncated or corrupt" in (work / "logs/tokenize/sample_bpe/big/0001.log").read_text()
    # The failed shard left nothing; its batch's other shard and the other batch are done.
    assert not (work / f"{TOK}/big/0001_text_document.bin").exists()
    assert not (work / f"{TOK}/big/batch0000.json").exists()
    done = {s: work / f"{TOK}/big/{s}_text_document" for s in ("0000", "0002", "0003")}
    for prefix in done.values():
        assert Path(f"{prefix}.bin").exists() and Path(f"{prefix}.idx").exists()
    # One Slurm job ran shards 0002 and 0003, side by side: their intervals overlap.
    batch1 = json.loads((work / f"{TOK}/big/batch0001.json").read_text())
    assert [r["shard"] for r in batch1["shards"]] == ["0002", "0003"]
    jobs = {r["slurm_job"] for r in batch1["shards"]}
    assert len(jobs) == 1 and None not in jobs, batch1
    assert len({r["pid"] for r in batch1["shards"]}) == 2
    assert overlapping(batch1["shards"]), batch1
    assert read_record(done["0000"])["slurm_job"] != batch1["shards"][0]["slurm_job"]
    kept = {
        s: [stat(Path(f"{p}{e}")) for e in (".bin", ".idx", ".shard.json")] for s, p in done.items()
    }

    # Fixed input: the rerun runs batch 0 again, which redoes shard 0001 alone.
    bad.write_bytes(good)
    slurmruns.run(work, cluster, *args, f"{MERGED}.bin")
    record = json.loads((work / f"{TOK}/big/batch0000.json").read_text())
    assert record["ran"] == ["0001"] and record["kept"] == ["0000"], record
    assert {
        s: [stat(Path(f"{p}{e}")) for e in (".bin", ".idx", ".shard.json")] for s, p in done.items()
    } == kept

    # The merged bytes equal a run of one shard per job (a local run).
    reference = prepare(tmp_path / "local", 1)
    slurmruns.run(reference, None, *args, f"{MERGED}.bin", profile="local")
    assert not (reference / f"{TOK}/big/batch0000.json").exists()
    for ext in (".bin", ".idx"):
        assert (work / f"{MERGED}{ext}").read_bytes() == (reference / f"{MERGED}{ext}").read_bytes()
