"""Real volume through Slurm: tokenize (from the files) -> merge of GBs of text on the test cluster.

Builds a varied corpus offline (the shipped sample corpus, each round perturbed so no two
copies are alike) as one JSONL.zst file per shard, trains a byte-level BPE on part of it, starts the project's two-node test Slurm
cluster (tests/slurm/testcluster.py; root, slurm-wlm and munge needed) and runs the
workflow's text stage through the official Slurm executor with profiles/testcluster.
Prints end-to-end tokens/s, each stage's time (first start to last end, and the sum over
its jobs), peak RSS per job (Snakemake's benchmark files), and the tokenize stage's
tokens/s against bare HF ``encode_batch`` on the same data, measured in the same run
(shard 0, the same thread count). The load average is printed next to the figures.

Usage: sudo .venv/bin/python benchmarks/text_volume.py [--gigabytes 2] [--shards 32]
       [--workdir DIR]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "slurm"))
THREADS = 4  # the tokenize rule's threads


def varied_documents(target_bytes: int):
    """The shipped sample corpus (resources/sample_text: English and 18 other languages),
    repeated with word-level perturbations (each round marks every seventh word
    differently) until ``target_bytes``."""
    from hpcllm.text.sample_corpus import _perturb
    from hpcllm.text.tokenization import read_texts

    base = [
        (f"{name}{i}", text)
        for name in ("en", "multilingual")
        for i, text in enumerate(
            t
            for b in read_texts(REPO / f"resources/sample_text/{name}.jsonl.zst", 1 << 22)
            for t in b
        )
    ]
    written = 0
    for rounds in itertools.count():
        for doc_id, text in base:
            text = text if rounds == 0 else _perturb(text, rounds)
            written += len(text.encode())
            yield f"{doc_id}-{rounds}", text
            if written >= target_bytes:
                return


def build_corpus(folder: Path, target_bytes: int, files: int) -> list[Path]:
    from hpcllm.text.sample_corpus import write_jsonl_zst

    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"part-{i:05d}.jsonl.zst" for i in range(files)]
    if all(p.exists() for p in paths):
        return paths
    docs = varied_documents(target_bytes)
    per_file = target_bytes // files
    for path in paths:
        taken, chunk = 0, []
        for doc in docs:
            chunk.append(doc)
            taken += len(doc[1].encode())
            if taken >= per_file:
                break
        write_jsonl_zst(chunk, path)
    return paths


def train_tokenizer(corpus: Path, out: Path) -> Path:
    from hpcllm.text.tokenizer_train import train_bpe

    if not (out / "tokenizer.json").exists():
        train_bpe(
            [corpus], out, vocab_size=32000, special_tokens=["<|endoftext|>"], sample_documents=5000
        )
    return out / "tokenizer.json"


def write_config(work: Path, files: list[Path], tokenizer: Path) -> None:
    import yaml

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["text"] = {
        "sources": {
            "volume": {"type": "local", "files": [str(p) for p in files], "shards": len(files)}
        },
        "tokenizers": {"bench": {"type": "files", "tokenizer_json": str(tokenizer)}},
        "tokenize": {"tokenizers": ["bench"]},
    }
    config["training"] = {"experiments": {}}
    (work / "config").mkdir(exist_ok=True)
    for item in (REPO / "config").iterdir():
        if item.name != "config.yaml" and not (work / "config" / item.name).exists():
            (work / "config" / item.name).symlink_to(item)
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    for name in ("profiles", "resources"):
        if not (work / name).exists():
            (work / name).symlink_to(REPO / name)


def stage_figures(work: Path, rule: str) -> dict:
    """Sum of job seconds and peak RSS per job from Snakemake's benchmark files."""
    rows = []
    for path in sorted((work / "results" / "timings" / rule).rglob("*.tsv")):
        with open(path) as f:
            rows += list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        return {"jobs": 0}
    rss = [float(r["max_rss"]) for r in rows if r["max_rss"] not in ("-", "NA")]
    return {
        "jobs": len(rows),
        "job_seconds_sum": sum(float(r["s"]) for r in rows),
        "job_seconds_median": statistics.median(float(r["s"]) for r in rows),
        "peak_rss_mb_max": max(rss) if rss else None,
        "peak_rss_mb_median": statistics.median(rss) if rss else None,
    }


def stage_span(work: Path, rule: str) -> float | None:
    """Seconds from the first job's log creation to the last log's last write."""
    logs = list((work / "logs" / rule).rglob("*.log"))
    if not logs:
        return None
    starts = [p.stat().st_ctime for p in logs]
    ends = [p.stat().st_mtime for p in logs]
    return max(ends) - min(starts)


def bare_hf_ratio(shard: Path, tokenizer: Path, work: Path) -> dict:
    """Shard 0 through bare HF encode_batch in a fresh process with the rule's threads,
    beside the tokenize job's own time on the same shard."""
    code = f"""
import os, sys, time, json
os.environ["RAYON_NUM_THREADS"] = "{THREADS}"
from tokenizers import Tokenizer
from hpcllm.text.tokenization import read_texts
tok = Tokenizer.from_file({str(tokenizer)!r})
texts = [t for b in read_texts({str(shard)!r}, 1 << 22) for t in b]
t = time.perf_counter()
n = 0
for i in range(0, len(texts), 2000):
    n += sum(len(e.ids) for e in tok.encode_batch(texts[i:i + 2000], add_special_tokens=False))
print(json.dumps({{"tokens": n, "seconds": time.perf_counter() - t}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    bare = json.loads(out.stdout)
    with open(work / "results/timings/tokenize/bench/volume/0000.tsv") as f:
        stage_s = float(next(csv.DictReader(f, delimiter="\t"))["s"])
    stage_tokens = bare["tokens"] + count_documents(work, "0000")  # + one EOD per document
    return {
        "bare_hf_tokens_per_s": bare["tokens"] / bare["seconds"],
        "stage_tokens_per_s": stage_tokens / stage_s,
        "ratio_stage_to_bare_hf": (stage_tokens / stage_s) / (bare["tokens"] / bare["seconds"]),
    }


def count_documents(work: Path, shard: str) -> int:
    path = work / f"data/tokenized/bench/volume/{shard}_text_document.manifest.json"
    return json.loads(path.read_text())["documents"]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gigabytes", type=float, default=2.0, help="text to generate, in GB")
    ap.add_argument("--shards", type=int, default=32, help="shards (one JSONL.zst file each)")
    ap.add_argument(
        "--workdir",
        type=Path,
        default=Path("/tmp/hpcllm-text-volume"),
        help="working folder of the corpus and the workflow run",
    )
    args = ap.parse_args(argv)
    import testcluster

    why = testcluster.missing_requirements()
    if why:
        raise SystemExit(why)
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    t = time.monotonic()
    files = build_corpus(work / "corpus", int(args.gigabytes * 1e9), args.shards)
    tokenizer = train_tokenizer(files[0], work / "tokenizer")
    print(f"corpus and tokenizer ready in {time.monotonic() - t:.0f} s", flush=True)
    run = work / "run"
    run.mkdir(exist_ok=True)
    write_config(run, files, tokenizer)
    target = [f"data/tokenized/bench/volume_text_document.{e}" for e in ("bin", "idx")]
    load_before = os.getloadavg()
    shutil.rmtree(work / "cluster", ignore_errors=True)  # a cluster's state is its own
    # A short folder: slurmstepd's socket, <root>/spool-n1/n1_<job>.<step>, must fit a Unix
    # socket path (107 bytes); under a deep work folder the jobs were cancelled at launch.
    with (
        tempfile.TemporaryDirectory(prefix="hpcllm-tc-") as root,
        testcluster.running(Path(root)) as cluster,
    ):
        snakemake = str(Path(sys.executable).parent / "snakemake")
        cmd = [
            snakemake,
            "-s",
            str(REPO / "Snakefile"),
            "-d",
            str(run),
            "--profile",
            "profiles/testcluster",
            "--forceall",
            *target,
        ]
        start = time.monotonic()
        proc = subprocess.run(
            cmd, cwd=run, env={**os.environ, **cluster.env}, capture_output=True, text=True
        )
        wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"the workflow failed:\n{proc.stderr[-5000:]}")
    from hpcllm.text.indexed_dataset import check_dataset

    index = check_dataset(str(run / "data/tokenized/bench/volume_text_document"))
    corpus_bytes = sum(
        json.loads(p.read_text())["bytes"]
        for p in (run / "data/tokenized/bench/volume").glob("*.manifest.json")
    )
    result = {
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "text_bytes": corpus_bytes,
        "shards": args.shards,
        "documents": int(len(index.sequence_lengths)),
        "tokens": int(index.num_tokens),
        "end_to_end_s": wall,
        "end_to_end_tokens_per_s": index.num_tokens / wall,
        "stages": {
            rule: {**stage_figures(run, rule), "span_s": stage_span(run, rule)}
            for rule in ("tokenize", "merge_tokenized")
        },
        **bare_hf_ratio(files[0], tokenizer, run),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
