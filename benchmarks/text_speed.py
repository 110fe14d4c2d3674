"""The text path on one 50 MB corpus and 2 cores, side by side with bare gigatoken,
Megatron-LM's ``tools/preprocess_data_fast.py`` and datatrove's Megatron tokenizer.

Builds a varied corpus offline (the shipped sample corpus, each round perturbed: see
benchmarks/text_volume.py) as one plain JSONL file and as 4 files of a quarter each,
trains a 32k byte-level BPE on it, then, in rounds (each tool once per round, so every
ratio compares runs minutes apart under the same load), measures:

- bare gigatoken: ``encode_batch`` on the texts already in memory (fresh process, the
  same tokenizer and special-token handling as the stage, ``--cores`` threads);
- the tokenize stage (``tokenize_source_shard`` on a local source of the JSONL file, in a
  fresh process, as the workflow's job runs it): its own seconds, what the check against
  HF tokenizers and loading gigatoken (its import included) took inside it, and the
  process's wall time;
- the text workflow end to end (``snakemake --profile profiles/local --cores N`` from an
  empty work folder to the merged ``.bin/.idx``) at 1 and 4 shards;
- Megatron-LM's ``preprocess_data_fast.py`` (``--use-gigatoken --append-eod``) on the
  whole file, and at 4 shards on each quarter one after the other plus
  ``tools/merge_datasets.py`` (the tool takes one input file);
- datatrove's ``JsonlReader`` -> ``MegatronDocumentTokenizer`` with 1 and 4 tasks
  (``--cores`` workers), if ``--datatrove-python`` is given.

Prints medians of ``--repeat`` rounds, every round's ratios, the corpus and the load
average (the machine may be shared: read ratios measured in the same round). Megatron-LM
needs a checkout (``--megatron-lm``; ``fetch`` github:NVIDIA/Megatron-LM) importable with
this Python; its GPU kernels import ``triton`` at import time: ``--extra-path`` a folder
holding ``triton`` if this environment lacks it.

Usage: python benchmarks/text_speed.py --megatron-lm DIR [--extra-path DIR]
       [--datatrove-python PY] [--workdir DIR] [--repeat 3] [--cores 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tokenize_stage import STAGE  # noqa: E402  (the stage as a job runs it, timed)

EOD = "<|endoftext|>"

BARE = """
import json, os, sys, time
os.environ["RAYON_NUM_THREADS"] = sys.argv[3]
from hpcllm.text.tokenization import gigatoken_encoder, load_tokenizer, read_texts, special_handling
tok = load_tokenizer(sys.argv[1])
texts = [t for b in read_texts(sys.argv[2], 1 << 24) for t in b]
with special_handling(tok, "text"):
    enc = gigatoken_encoder(tok)
enc.encode(texts[:50])  # the thread pool started
t = time.perf_counter()
flat, lengths = enc.encode(texts)
s = time.perf_counter() - t
print(json.dumps({"tokens": int(len(flat)), "documents": len(texts), "seconds": s,
                  "bytes": sum(len(x.encode()) for x in texts)}))
"""

MEGATRON = """
import runpy, sys, types, typing
sys.path.append(sys.argv[1])  # --extra-path (triton), after everything else
if not hasattr(typing, "override"):
    import typing_extensions
    typing.override = typing_extensions.override
tool = sys.argv[2]
sys.argv = sys.argv[2:]
runpy.run_path(tool, run_name="__main__")
"""

DATATROVE = """
import sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import MegatronDocumentTokenizer
folder, tokenizer, out, tasks, workers, logs = sys.argv[1:7]
LocalPipelineExecutor(
    pipeline=[
        JsonlReader(folder, glob_pattern="part-*.jsonl" if int(tasks) > 1 else "whole.jsonl"),
        MegatronDocumentTokenizer(out, tokenizer_name_or_path=tokenizer, eos_token="<|endoftext|>"),
    ],
    tasks=int(tasks),
    workers=int(workers),
    logging_dir=logs,
).run()
"""


def build(work: Path, target_bytes: int) -> tuple[Path, list[Path], Path]:
    """whole.jsonl, part-0..3.jsonl (the same documents in order) and a 32k BPE."""
    import orjson
    from text_volume import varied_documents

    whole = work / "corpus" / "whole.jsonl"
    parts = [work / "corpus" / f"part-{i}.jsonl" for i in range(4)]
    if not whole.exists():
        whole.parent.mkdir(parents=True, exist_ok=True)
        lines = [
            orjson.dumps({"id": i, "text": t}) + b"\n" for i, t in varied_documents(target_bytes)
        ]
        whole.write_bytes(b"".join(lines))
        per = -(-len(lines) // 4)
        for i, part in enumerate(parts):
            part.write_bytes(b"".join(lines[i * per : (i + 1) * per]))
    tok = work / "tokenizer" / "tokenizer.json"
    if not tok.exists():
        from hpcllm.text.tokenizer_train import train_bpe

        train_bpe([whole], tok.parent, 32000, [EOD], sample_documents=4000)
    return whole, parts, tok


def py(code: str, *args, env=None, python=sys.executable) -> tuple[str, float]:
    start = time.perf_counter()
    proc = subprocess.run(
        [python, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"failed: {code[:60]!r} {args}\n{proc.stderr[-3000:]}")
    return proc.stdout, wall


def workflow(work: Path, files: list[Path], tok: Path, cores: int) -> float:
    """Wall seconds of the text workflow from an empty folder to the merged dataset."""
    from text_volume import write_config

    run = work / f"run{len(files)}"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    write_config(run, files, tok)
    target = [f"data/tokenized/bench/volume_text_document.{e}" for e in ("bin", "idx")]
    cmd = [str(Path(sys.executable).parent / "snakemake"), "-s", str(REPO / "Snakefile")]
    cmd += ["-d", str(run), "--profile", "profiles/local", "--cores", str(cores), *target]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=run, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"the workflow failed:\n{proc.stderr[-4000:]}")
    return wall


def megatron(args, work: Path, inputs: list[Path], tok: Path) -> float:
    """Wall seconds of preprocess_data_fast.py over ``inputs`` (one run per file), plus
    merge_datasets.py when there are several."""
    out = work / f"megatron{len(inputs)}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {"PYTHONPATH": str(args.megatron_lm), "RAYON_NUM_THREADS": str(args.cores)}
    tool = args.megatron_lm / "tools"
    total = 0.0
    for i, path in enumerate(inputs):
        argv = [
            "--input",
            path,
            "--output-prefix",
            out / f"p{i}",
            "--append-eod",
            "--use-gigatoken",
        ]
        argv += ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tok.parent]
        _, wall = py(MEGATRON, args.extra_path, tool / "preprocess_data_fast.py", *argv, env=env)
        total += wall
    if len(inputs) > 1:
        merged = out / "merged"
        merged.mkdir()
        for f in out.glob("p*_text_document.*"):
            f.rename(merged / f.name)
        argv = ["--input", merged, "--output-prefix", out / "all_text_document"]
        _, wall = py(MEGATRON, args.extra_path, tool / "merge_datasets.py", *argv, env=env)
        total += wall
    return total


def datatrove(args, work: Path, tok: Path, tasks: int) -> float:
    out = work / f"datatrove{tasks}"
    shutil.rmtree(out, ignore_errors=True)
    _, wall = py(
        DATATROVE,
        work / "corpus",
        tok,
        out / "tokens",
        tasks,
        min(tasks, args.cores),
        out / "logs",
        python=args.datatrove_python,
        env={"RAYON_NUM_THREADS": str(args.cores), "HF_HUB_OFFLINE": "1"},
    )
    return wall


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--workdir",
        type=Path,
        default=Path("/tmp/hpcllm-text-speed"),
        help="scratch folder for the corpus and the runs (default: %(default)s)",
    )
    ap.add_argument("--megatron-lm", type=Path, help="a Megatron-LM checkout (tools/)")
    ap.add_argument("--extra-path", default="", help="appended to Megatron's sys.path (triton)")
    ap.add_argument("--datatrove-python", help="a Python with datatrove installed")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (medians)")
    ap.add_argument("--cores", type=int, default=2, help="cores every tool gets")
    ap.add_argument("--megabytes", type=float, default=50, help="corpus size")
    ap.add_argument(
        "--stage-only", action="store_true", help="only the stage against bare gigatoken"
    )
    args = ap.parse_args(argv)
    work = args.workdir
    whole, parts, tok = build(work, int(args.megabytes * 1e6))
    if args.megatron_lm:
        args.megatron_lm = args.megatron_lm.resolve()
    print(f"corpus: {whole} ({whole.stat().st_size / 1e6:.1f} MB JSONL) and 4 parts; {tok}")
    rounds = []
    for r in range(args.repeat):
        load = os.getloadavg()[0]
        row: dict = {"load_1min_start": load}
        out, _ = py(BARE, tok, whole, args.cores)
        bare = json.loads(out)
        row["bare_gigatoken_tokens_per_s"] = bare["tokens"] / bare["seconds"]
        out, wall = py(STAGE, tok, whole, work / "stage_text_document", args.cores, "check")
        stage = json.loads(out)
        # The stage writes one EOD per document more than the bare encode: same text.
        row["stage_tokens_per_s"] = (stage["tokens"] - bare["documents"]) / stage["seconds"]
        row["stage_s"], row["stage_process_wall_s"] = stage["seconds"], wall
        row["check_share_of_stage"] = stage["check_s"] / stage["seconds"]
        row["gigatoken_load_s"] = stage["load_s"]  # import and load, in the stage
        row["stage_vs_bare_gigatoken"] = (
            row["stage_tokens_per_s"] / row["bare_gigatoken_tokens_per_s"]
        )
        for n, files in () if args.stage_only else ((1, [whole]), (4, parts)):
            row[f"workflow_{n}_shards_s"] = workflow(work, files, tok, args.cores)
            if args.megatron_lm:
                row[f"megatron_{n}_shards_s"] = megatron(args, work, files, tok)
                row[f"ours_vs_megatron_{n}_shards"] = (
                    row[f"megatron_{n}_shards_s"] / row[f"workflow_{n}_shards_s"]
                )
            if args.datatrove_python:
                row[f"datatrove_{n}_tasks_s"] = datatrove(args, work, tok, n)
                row[f"ours_vs_datatrove_{n}"] = (
                    row[f"datatrove_{n}_tasks_s"] / row[f"workflow_{n}_shards_s"]
                )
        row["load_1min_end"] = os.getloadavg()[0]
        rounds.append(row)
        print(json.dumps({"round": r, **row}), flush=True)
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    result = {
        "corpus_bytes": bare["bytes"],
        "documents": bare["documents"],
        "tokens": bare["tokens"],
        "encoder": stage["encoder"],
        "cores": args.cores,
        "medians": med,
        "rounds": rounds,
    }
    print(json.dumps(result, indent=2))
    for key in sorted(k for k in med if "_vs_" in k or k.startswith("check")):
        print(f"{key:32s} median {med[key]:6.2f}  rounds {[round(r[key], 2) for r in rounds]}")
    return result


if __name__ == "__main__":
    main()
