"""Planning cost of the text stages at FineWeb size, against bare Snakemake in the same run.

For each size N (total shards over two local sources, tokenized with two tokenizers:
2N tokenize and 4 merge_tokenized jobs; the sources are read in place, no
login-node step) this dry-runs

- the workflow (``-s Snakefile``) with a cluster profile (default: juwels), and
- a bare Snakefile of the same shape (the same rule names, so the profile gives the same
  resources; outputs, logs and benchmarks named alike; input functions as plain
  list comprehensions; no config validation, params or plan-time checks),

each in a fresh process, and prints CPU time (user + system, the figure to compare on a
loaded machine), wall time, peak RSS and their ratios (medians of --repeat interleaved
runs). Snakemake's dry-run output is discarded (``--quiet all``) for both.

Usage: python benchmarks/plan_scale.py [--jobs 3000 50000 | --shards 1000 10000]
       [--profile juwels] [--repeat 1] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("web_a", "web_b")
TOKENIZERS = ("tok_a", "tok_b")

BARE = """
SOURCES = {sources!r}
TOKENIZERS = {tokenizers!r}
SHARDS = {shards!r}
FILES = {{s: ["in.jsonl"] for s in SOURCES}}


wildcard_constraints:
    source="|".join(SOURCES),
    tok="|".join(TOKENIZERS),
    shard=r"\\d{{4}}\\d*",


rule all:
    input:
        expand("data/tokenized/{{tok}}/{{source}}_text_document.{{ext}}", tok=TOKENIZERS, source=SOURCES, ext=("bin", "idx")),


rule tokenize:
    input:
        source=lambda w: FILES[w.source],
        tokenizer="tokenizers/{{tok}}/tokenizer.json",
    output:
        multiext("data/tokenized/{{tok}}/{{source}}/{{shard}}_text_document", ".bin", ".idx", ".manifest.json"),
    log:
        "logs/tokenize/{{tok}}/{{source}}/{{shard}}.log",
    benchmark:
        "benchmarks/tokenize/{{tok}}/{{source}}/{{shard}}.tsv"
    threads: 4
    resources:
        mem_mb=4000,
        runtime=60,
    shell:
        "true"


rule merge_tokenized:
    input:
        shards=lambda w: [f"data/tokenized/{{w.tok}}/{{w.source}}/{{s}}_text_document{{e}}" for s in SHARDS[w.source] for e in (".bin", ".idx")],
        manifests=lambda w: [f"data/tokenized/{{w.tok}}/{{w.source}}/{{s}}_text_document.manifest.json" for s in SHARDS[w.source]],
    output:
        multiext("data/tokenized/{{tok}}/{{source}}_text_document", ".bin", ".idx"),
    log:
        "logs/merge_tokenized/{{tok}}/{{source}}.log",
    benchmark:
        "benchmarks/merge_tokenized/{{tok}}/{{source}}.tsv"
    resources:
        mem_mb=4000,
        runtime=60,
    shell:
        "true"
"""

# CPU time, wall time and peak RSS of one command, measured from a parent that runs
# nothing else.
MEASURE = """
import resource, subprocess, sys, time, json
t = time.perf_counter()
p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
wall = time.perf_counter() - t
use = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": p.returncode, "wall": wall, "cpu": use.ru_utime + use.ru_stime,
                  "rss_mb": use.ru_maxrss / 1024, "err": p.stderr[-3000:]}))
"""


def shard_names(n: int) -> list[str]:
    return [f"{i:04d}" for i in range(n)]  # as the workflow names them


def make_case(root: Path, shards: int) -> Path:
    """A working directory with the workflow's config for ``shards`` shards in all, and the
    bare Snakefile of the same shape."""
    work = root / f"n{shards}"
    if work.exists():
        return work
    work.mkdir(parents=True)
    for name in ("resources", "profiles"):
        (work / name).symlink_to(REPO / name)
    (work / "config").mkdir()
    for item in (REPO / "config").iterdir():
        if item.name != "config.yaml":
            (work / "config" / item.name).symlink_to(item)
    (work / "in.jsonl").write_text('{"text": "a document"}\n')
    per_source = {s: shards // len(SOURCES) for s in SOURCES}
    from tokenizers import Tokenizer, models

    # A loadable tokenizer with the end-of-document token (the plan checks both).
    tiny = Tokenizer(models.WordLevel({"<|endoftext|>": 0, "a": 1}, unk_token="a"))
    tiny.add_special_tokens(["<|endoftext|>"])
    for tok in TOKENIZERS:
        (work / "tokenizers" / tok).mkdir(parents=True)
        tiny.save(str(work / "tokenizers" / tok / "tokenizer.json"))
    import yaml

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config.update(
        {
            "text": {
                "sources": {
                    s: {"type": "local", "files": "in.jsonl", "shards": n}
                    for s, n in per_source.items()
                },
                "tokenizers": {
                    t: {"type": "files", "tokenizer_json": f"tokenizers/{t}/tokenizer.json"}
                    for t in TOKENIZERS
                },
                # one shard per job, as in the bare Snakefile (a GPU site's auto packs a
                # node's worth of shards into each tokenize_batch job: another job graph)
                "tokenize": {"tokenizers": list(TOKENIZERS), "shards_per_job": 1},
            },
            "training": {"experiments": {}},
        }
    )
    (work / "config" / "config.yaml").write_text(json.dumps(config))
    names = {s: shard_names(n) for s, n in per_source.items()}
    (work / "Snakefile.bare").write_text(
        BARE.format(sources=list(SOURCES), tokenizers=list(TOKENIZERS), shards=names)
    )
    return work


def text_targets(shards: int) -> list[str]:
    return [
        f"data/tokenized/{t}/{s}_text_document.{e}"
        for t in TOKENIZERS
        for s in SOURCES
        for e in ("bin", "idx")
    ]


def measure(cmd: list[str], cwd: Path) -> dict:
    env = {**os.environ, "HPCLLM_ACCOUNT": os.environ.get("HPCLLM_ACCOUNT", "benchmark")}
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, *cmd], cwd=cwd, env=env, capture_output=True, text=True
    )
    result = json.loads(out.stdout)
    if result["rc"] != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{result['err']}")
    return result


def snakemake() -> str:
    path = Path(sys.executable).parent / "snakemake"
    return str(path) if path.exists() else "snakemake"


def run(sizes: list[int], profile: str, repeat: int, root: Path) -> list[dict]:
    rows = []
    common = ["-n", "--quiet", "all", "--profile", f"profiles/{profile}"]
    for n in sizes:
        work = make_case(root, n)
        ours_cmd = [
            snakemake(),
            "-s",
            str(REPO / "Snakefile"),
            "-d",
            str(work),
            *common,
            "--",
            *text_targets(n),
        ]
        bare_cmd = [snakemake(), "-s", "Snakefile.bare", "-d", str(work), *common]
        ours, bare = [], []
        for _ in range(repeat):  # interleaved, so load changes hit both alike
            bare.append(measure(bare_cmd, work))
            ours.append(measure(ours_cmd, work))
        # one tokenize job per shard and tokenizer, one merge per source and tokenizer
        jobs = (n // len(SOURCES) * len(SOURCES) + len(SOURCES)) * len(TOKENIZERS)
        row = {
            "shards": n,
            "jobs": jobs,
            "ours_cpu_s": statistics.median(r["cpu"] for r in ours),
            "bare_cpu_s": statistics.median(r["cpu"] for r in bare),
            "ours_s": statistics.median(r["wall"] for r in ours),
            "bare_s": statistics.median(r["wall"] for r in bare),
            "ours_rss_mb": statistics.median(r["rss_mb"] for r in ours),
            "bare_rss_mb": statistics.median(r["rss_mb"] for r in bare),
        }
        row["cpu_ratio"] = row["ours_cpu_s"] / row["bare_cpu_s"]
        row["time_ratio"] = row["ours_s"] / row["bare_s"]
        row["rss_ratio"] = row["ours_rss_mb"] / row["bare_rss_mb"]
        rows.append(row)
        print(
            f"{n:>7} shards {jobs:>7} jobs | workflow CPU {row['ours_cpu_s']:7.1f} s, wall "
            f"{row['ours_s']:7.1f} s, {row['ours_rss_mb']:6.0f} MB | bare CPU "
            f"{row['bare_cpu_s']:7.1f} s, wall {row['bare_s']:7.1f} s, "
            f"{row['bare_rss_mb']:6.0f} MB | ratio CPU {row['cpu_ratio']:.2f}, ratio time "
            f"(wall) {row['time_ratio']:.2f}, RSS {row['rss_ratio']:.2f} | load "
            f"{os.getloadavg()[0]:.1f} (1 min)",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument(
        "--jobs",
        type=int,
        nargs="+",
        help="sizes to plan, in jobs: 2 per shard (one per tokenizer) + 4 merges "
        "(default: 3000 50000)",
    )
    size.add_argument(
        "--shards",
        type=int,
        nargs="+",
        help="sizes to plan, in shards over the two sources",
    )
    ap.add_argument("--profile", default="juwels", help="cluster profile of the dry runs")
    ap.add_argument("--repeat", type=int, default=1, help="dry runs per size and Snakefile")
    ap.add_argument(
        "--workdir", type=Path, help="working folder (default: a temporary one, deleted)"
    )
    args = ap.parse_args(argv)
    if not args.shards:
        jobs = args.jobs or [3000, 50000]
        merges = len(SOURCES) * len(TOKENIZERS)
        args.shards = [(j - merges) // len(TOKENIZERS) for j in jobs]
    print(f"load: {os.getloadavg()[0]:.1f} (1 min), profile {args.profile}", flush=True)
    start = time.monotonic()
    if args.workdir:
        rows = run(args.shards, args.profile, args.repeat, args.workdir)
    else:
        with tempfile.TemporaryDirectory() as d:
            rows = run(args.shards, args.profile, args.repeat, Path(d))
    print(f"total {time.monotonic() - start:.0f} s")
    return rows


if __name__ == "__main__":
    main()
