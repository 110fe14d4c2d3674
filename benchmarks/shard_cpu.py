"""What cutting one file into shards costs: the CPU of 4 tokenize shards of one plain
JSONL file against the CPU of 1 shard of the same file (issue 51, goal at most 1.2x).

Builds a varied JSONL corpus offline (the shipped sample corpus, perturbed: see
benchmarks/text_volume.py) and a 32k byte-level BPE, then, in rounds, runs the tokenize
stage (``tokenize_source_shard``, as a ``tokenize`` job runs it) in fresh processes: the
whole file as 1 shard, and the 4 shards of it one after the other. The order of the two
alternates from round to round. CPU seconds are user + system of the processes
(``RUSAGE_CHILDREN``), wall seconds beside them; a job's fixed cost (its Python start
and imports, the tokenizer's load) is in both, once for 1 shard and 4 times for 4: it is
measured on its own (a shard of one document) and the ratio is also printed without it.
Python writes the modules' bytecode (``__pycache__``) as it does on a cluster by default:
``PYTHONDONTWRITEBYTECODE`` is removed from the processes' environment and a one-document
shard runs once before the rounds (``--no-bytecode`` keeps the variable as set: every
process then compiles the package from source, part of each job's fixed cost; its
``__pycache__`` folders are removed first).
Prints every round's ratios and their medians, with the load average. ``--compare REF`` also runs the stage of git
revision REF (its ``src`` exported) in the same rounds.

Usage: python benchmarks/shard_cpu.py [--text-megabytes 200] [--repeat 5] [--shards 4]
       [--workdir DIR] [--compare REF] [--no-bytecode]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHARD = """
import os, sys
os.environ["RAYON_NUM_THREADS"] = "1"
from hpcllm.text.shards import source_policy, tokenize_source_shard
from hpcllm.text.tokenization import load_tokenizer
cfg = {"type": "local", "files": [sys.argv[2]]}
k, n, prefix = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
tokenize_source_shard(
    "bench", cfg, source_policy(cfg, {}, k, n), k, n, prefix, prefix + ".manifest.json",
    load_tokenizer(sys.argv[1]), "<|endoftext|>",
)
"""


def prepare(work: Path, text_bytes: int) -> tuple[Path, Path]:
    """The JSONL corpus (one plain file) and a 32k BPE trained on its start."""
    import orjson
    from text_volume import train_tokenizer, varied_documents

    work.mkdir(parents=True, exist_ok=True)
    path = work / f"corpus-{text_bytes // 1_000_000}MB.jsonl"
    if not path.exists():
        with open(f"{path}.part", "wb") as out:
            for doc_id, text in varied_documents(text_bytes):
                out.write(orjson.dumps({"text": text, "id": doc_id}) + b"\n")
        os.replace(f"{path}.part", path)
    sample = work / "tokenizer-sample.jsonl"
    if not sample.exists():
        with open(path, "rb") as src:
            sample.write_bytes(b"".join(src.readline() for _ in range(3000)))
    return path, train_tokenizer(sample, work / "tokenizer")


def export_src(ref: str, folder: Path) -> Path:
    if not (folder / "src").is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", ref, "src"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder / "src"


def shards_cost(
    src: Path, tok: Path, path: Path, shards: int, out: Path, bytecode: bool = True
) -> tuple[float, float]:
    """CPU and wall seconds of the ``shards`` shard processes, one after the other."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    for k in range(shards):
        prefix = out / f"{shards}-{k:04d}_text_document"
        cmd = [sys.executable, "-c", SHARD, str(tok), str(path), str(k), str(shards), str(prefix)]
        proc = subprocess.run(cmd, env=env, capture_output=True)
        if proc.returncode:
            raise SystemExit(f"shard {k}/{shards} failed:\n{proc.stderr.decode()[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--workdir",
        type=Path,
        default=Path("/tmp/hpcllm-shard-cpu"),
        help="working folder (made; the text and the jobs' outputs)",
    )
    ap.add_argument("--text-megabytes", type=float, default=200, help="text in the file")
    ap.add_argument("--shards", type=int, default=4, help="the shards compared with 1")
    ap.add_argument("--repeat", type=int, default=5, help="rounds (median of their ratios)")
    ap.add_argument("--compare", metavar="REF", help="also run git revision REF's stage")
    ap.add_argument(
        "--no-bytecode",
        action="store_true",
        help="keep PYTHONDONTWRITEBYTECODE as the environment sets it",
    )
    args = ap.parse_args(argv)
    bytecode = not args.no_bytecode
    work = args.workdir.resolve()
    path, tok = prepare(work, int(args.text_megabytes * 1e6))
    print(f"file: {path} ({path.stat().st_size / 1e6:.1f} MB); tokenizer {tok}")
    sources = {"here": REPO / "src"}
    if args.compare:
        sources[args.compare] = export_src(args.compare, work / f"rev-{args.compare}")
    out = work / "out"
    out.mkdir(exist_ok=True)
    tiny = work / "one-document.jsonl"
    with open(path, "rb") as src:
        tiny.write_bytes(src.readline())
    print(
        "bytecode: written and reused (Python's default)"
        if bytecode
        else f"bytecode: PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}"
    )
    if bytecode:  # the first process of each source writes it
        for src in sources.values():
            shards_cost(src, tok, tiny, 1, out, bytecode)
    else:
        from job_overhead import drop_bytecode

        drop_bytecode(*sources.values())
    ratios: dict[str, list[float]] = {name: [] for name in sources}
    work_ratios: dict[str, list[float]] = {name: [] for name in sources}
    for r in range(args.repeat):
        load = os.getloadavg()[0]
        for name, src in sources.items():
            runs = {}
            for shards in (1, args.shards)[:: 1 if r % 2 == 0 else -1]:
                runs[shards] = shards_cost(src, tok, path, shards, out, bytecode)
            fixed, _ = shards_cost(src, tok, tiny, 1, out, bytecode)
            (cpu1, wall1), (cpun, walln) = runs[1], runs[args.shards]
            ratios[name].append(cpun / cpu1)
            # the same without the fixed cost of a job: what reading and encoding cost
            work_ratio = (cpun - args.shards * fixed) / max(cpu1 - fixed, 1e-9)
            work_ratios[name].append(work_ratio)
            print(
                f"round {r + 1} ({name}, load {load:.1f}): 1 shard {cpu1:.2f} CPU-s "
                f"({wall1:.2f} s wall), {args.shards} shards {cpun:.2f} CPU-s "
                f"({walln:.2f} s wall): ratio {cpun / cpu1:.2f}; a one-document shard "
                f"(the fixed cost of a job) {fixed:.2f} CPU-s; without it {work_ratio:.2f}"
            )
    medians = {name: statistics.median(v) for name, v in ratios.items()}
    work_medians = {name: statistics.median(v) for name, v in work_ratios.items()}
    for name, m in medians.items():
        print(
            f"{name}: {args.shards} shards / 1 shard, CPU, median of {args.repeat}: {m:.2f} "
            f"(without the jobs' fixed cost: {work_medians[name]:.2f})"
        )
    return {"ratios": ratios, "medians": medians, "work_medians": work_medians}


if __name__ == "__main__":
    main()
