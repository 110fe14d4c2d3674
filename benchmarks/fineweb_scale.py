"""FineWeb-shaped Parquet through tokenize -> merge on the two-node test Slurm cluster.

Generates a mirror with FineWeb's layout in ``--workdir`` (never the checkout's data/):
``--files`` Parquet files with FineWeb's columns (text, id, dump, url, date, file_path,
language, language_score, token_count), several row groups each, until the files hold
``--parquet-gigabytes`` of Parquet (pyarrow's default codec, snappy). The text is the
shipped sample corpus, each round perturbed (benchmarks/text_volume.py) and every
document's words shuffled: repeated phrases make the plain perturbed text compress 2.5x
in Parquet, far better than web text; shuffled it compresses about 1.9x. A 32k byte-level
BPE is trained on part of it. The workflow's text stage then runs from a ``type: local``
source over those files (read in place, no login-node step) through the official Slurm
executor with profiles/testcluster (tests/slurm/testcluster.py; root, slurm-wlm and munge
needed), and the script prints:

- tokens/s end to end (Snakemake's start to the merged dataset);
- per stage (every rule that ran): first start to last end, sum and median of its jobs,
  peak RSS per job (Snakemake's benchmark files);
- bytes on disk per token: the Parquet inputs, the intermediates (everything the workflow
  wrote under data/ but the merged dataset: the per-shard ``.bin/.idx``, manifests) and
  the merged output;
- bare pyarrow + gigatoken on the same files (one process, the machine's cores: read the
  text column by row group, encode, count), and the workflow's ratio to it.

The load average is printed with the figures (read ratios; the machine may be shared).

Usage: sudo .venv/bin/python benchmarks/fineweb_scale.py [--parquet-gigabytes 2]
       [--files 8] [--shards 8] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "slurm"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
EOD = "<|endoftext|>"

BARE = """
import json, os, sys, time
os.environ["RAYON_NUM_THREADS"] = sys.argv[2]
t0 = time.perf_counter()
import pyarrow.parquet as pq
from hpcllm.text.tokenization import gigatoken_encoder, load_tokenizer, special_handling
tok = load_tokenizer(sys.argv[1])
with special_handling(tok, "text"):
    enc = gigatoken_encoder(tok)
tokens = docs = 0
for path in sys.argv[3:]:
    f = pq.ParquetFile(path)
    for batch in f.iter_batches(batch_size=4096, columns=["text"]):
        flat, lengths = enc.encode(batch.column(0).to_pylist())
        tokens += len(flat)
        docs += len(lengths)
print(json.dumps({"tokens": tokens, "documents": docs, "seconds": time.perf_counter() - t0}))
"""


FINEWEB_SCHEMA = [
    ("text", "string"),
    ("id", "string"),
    ("dump", "string"),
    ("url", "string"),
    ("date", "string"),
    ("file_path", "string"),
    ("language", "string"),
    ("language_score", "float64"),
    ("token_count", "int64"),
]


def fineweb_rows(docs, start: int) -> dict:
    """FineWeb's columns for ``docs`` (id, text) pairs; metadata shaped like the real one."""
    texts = [t for _, t in docs]
    n = len(texts)
    return {
        "text": texts,
        "id": [f"<urn:uuid:{start + i:08x}-0000-4000-8000-000000000000>" for i in range(n)],
        "dump": ["CC-MAIN-2024-10"] * n,
        "url": [f"https://example.org/{doc_id}" for doc_id, _ in docs],
        "date": ["2024-02-21T10:11:12Z"] * n,
        "file_path": [
            "s3://commoncrawl/crawl-data/CC-MAIN-2024-10/segments/1707947473347.0/warc/"
            f"CC-MAIN-20240220211055-20240221001055-{(start + i) % 100000:05d}.warc.gz"
            for i in range(n)
        ],
        "language": ["en"] * n,
        "language_score": [0.9] * n,
        "token_count": [len(t) // 4 for t in texts],
    }


def web_like_documents():
    """The perturbed sample corpus without end, every document's words shuffled (seeded:
    the same mirror every time), so that it compresses about as badly as web text."""
    import random

    from text_volume import varied_documents

    rng = random.Random(22)
    for doc_id, text in varied_documents(1 << 62):
        words = text.split(" ")
        rng.shuffle(words)
        yield doc_id, " ".join(words)


def build_mirror(folder: Path, parquet_bytes: int, files: int, row_group_bytes: int) -> list[Path]:
    """``files`` Parquet files of FineWeb's columns, row groups of ``row_group_bytes`` of
    text, each file written until it holds ``parquet_bytes / files`` of Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = [folder / f"{i:03d}_00000.parquet" for i in range(files)]
    if all(p.exists() for p in paths):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    docs = web_like_documents()
    per_file = parquet_bytes / files
    start = 0
    for path in paths:
        tmp = path.with_suffix(".part")
        with pq.ParquetWriter(tmp, pa.schema(FINEWEB_SCHEMA)) as writer:
            # The row groups written so far are on disk: the file's size is the Parquet.
            while tmp.stat().st_size < per_file:
                group, size = [], 0
                for doc in docs:
                    group.append(doc)
                    size += len(doc[1].encode())
                    if size >= row_group_bytes:
                        break
                table = pa.table(fineweb_rows(group, start), schema=pa.schema(FINEWEB_SCHEMA))
                start += len(group)
                writer.write_table(table, row_group_size=len(group))  # one row group
        tmp.rename(path)
    return paths


def stage_span(run: Path, rule: str) -> float | None:
    """Seconds from the first job's start to the last log's last write. A job starts at
    its log's first line or its benchmark's seconds before the log's last write, whichever
    is earlier (a log's ctime changes with every write; merge_tokenized logs one line, at
    its end)."""
    import csv
    import datetime

    starts, ends = [], []
    for path in (run / "logs" / rule).rglob("*.log"):
        end = path.stat().st_mtime
        ends.append(end)
        candidates = []
        with open(path) as f:
            first = f.readline()
        try:
            stamp = datetime.datetime.strptime(first[:23], "%Y-%m-%d %H:%M:%S,%f")
            candidates.append(stamp.timestamp())
        except ValueError:
            pass
        timing = run / "results/timings" / rule / path.relative_to(run / "logs" / rule)
        if timing.with_suffix(".tsv").exists():
            with open(timing.with_suffix(".tsv")) as f:
                candidates += [end - float(row["s"]) for row in csv.DictReader(f, delimiter="\t")]
        starts.append(min(candidates, default=end))
    return max(ends) - min(starts) if ends else None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--parquet-gigabytes", type=float, default=2.0, help="Parquet to generate, in GB"
    )
    ap.add_argument("--files", type=int, default=8, help="Parquet files of the mirror")
    ap.add_argument("--row-group-mb", type=float, default=64, help="text per row group, MB")
    # At most one shard per file, each shard reads whole files of its own; with more, each
    # reads the row groups of its block of rows (16 shards over the 8 default files: 128 s
    # end to end on a quiet machine, every shard's reading 1.4-1.5 s alone).
    ap.add_argument("--shards", type=int, default=8, help="the source's shards")
    ap.add_argument(
        "--workdir",
        type=Path,
        default=Path("/tmp/hpcllm-fineweb-scale"),
        help="the mirror, the tokenizer and the workflow's run folder",
    )
    args = ap.parse_args(argv)
    import testcluster
    from text_volume import stage_figures, train_tokenizer, write_config

    why = testcluster.missing_requirements()
    if why:
        raise SystemExit(why)
    work = args.workdir.resolve()
    t = time.monotonic()
    files = build_mirror(
        work / "mirror",
        int(args.parquet_gigabytes * 1e9),
        args.files,
        int(args.row_group_mb * 1e6),
    )
    import pyarrow.parquet as pq

    layout = [
        (p.name, pq.ParquetFile(p).metadata.num_row_groups, pq.ParquetFile(p).metadata.num_rows)
        for p in files
    ]
    sample = work / "tokenizer-sample.jsonl"
    if not sample.exists():
        import orjson

        texts = pq.ParquetFile(files[0]).read_row_group(0, columns=["text"]).column(0)
        sample.write_bytes(b"".join(orjson.dumps({"text": x}) + b"\n" for x in texts.to_pylist()))
    tokenizer = train_tokenizer(sample, work / "tokenizer")
    print(f"mirror {layout} and tokenizer ready in {time.monotonic() - t:.0f} s", flush=True)

    run = work / "run"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir()
    write_config(run, files, tokenizer)
    config = run / "config" / "config.yaml"
    config.write_text(config.read_text().replace(f"shards: {len(files)}", f"shards: {args.shards}"))
    target = [f"data/tokenized/bench/volume_text_document.{e}" for e in ("bin", "idx")]
    load_before = os.getloadavg()
    shutil.rmtree(work / "cluster", ignore_errors=True)
    # A short folder: slurmstepd's socket, <root>/spool-n1/n1_<job>.<step>, must fit a Unix
    # socket path (107 bytes); under a deep work folder the jobs were cancelled at launch.
    with (
        tempfile.TemporaryDirectory(prefix="hpcllm-tc-") as root,
        testcluster.running(Path(root)) as cluster,
    ):
        cmd = [str(Path(sys.executable).parent / "snakemake"), "-s", str(REPO / "Snakefile")]
        cmd += ["-d", str(run), "--profile", "profiles/testcluster", *target]
        start = time.monotonic()
        proc = subprocess.run(
            cmd, cwd=run, env={**os.environ, **cluster.env}, capture_output=True, text=True
        )
        wall = time.monotonic() - start
    load_after = os.getloadavg()
    if proc.returncode != 0:
        raise SystemExit(f"the workflow failed:\n{proc.stderr[-5000:]}")
    from hpcllm.text.indexed_dataset import check_dataset

    index = check_dataset(str(run / "data/tokenized/bench/volume_text_document"))
    tokens = int(index.num_tokens)
    import pyarrow.compute as pc

    text_bytes = sum(
        pc.sum(pc.binary_length(pq.ParquetFile(p).read(columns=["text"]).column(0))).as_py()
        for p in files
    )

    def size(paths) -> int:
        return sum(p.stat().st_size for p in paths if p.is_file())

    merged = list((run / "data/tokenized/bench").glob("volume_text_document.*"))
    written = list((run / "data").rglob("*"))
    disk = {
        "inputs_parquet": size(files),
        # Everything the workflow wrote under data/ but the merged dataset: the shards'
        # .bin/.idx and manifests (no copy of the text: the jobs read the Parquet).
        "intermediates": size(p for p in written if p not in merged),
        "intermediate_shards": size((run / "data/tokenized/bench/volume").rglob("*")),
        "outputs_merged": size(merged),
    }
    cores = os.cpu_count() or 2
    out = subprocess.run(
        [sys.executable, "-c", BARE, str(tokenizer), str(cores), *map(str, files)],
        capture_output=True,
        text=True,
        check=True,
    )
    bare = json.loads(out.stdout)
    result = {
        "load_1min_5min_15min_before": load_before,
        "load_after": load_after,
        "load_after_bare": os.getloadavg(),
        "mirror": {
            "files": layout,
            "columns": pq.ParquetFile(files[0]).schema_arrow.names,
            "parquet_bytes": disk["inputs_parquet"],
            "text_bytes": text_bytes,
            "text_bytes_per_parquet_byte": text_bytes / disk["inputs_parquet"],
            "text_bytes_per_token": text_bytes / tokens,
        },
        "shards": args.shards,
        "documents": int(len(index.sequence_lengths)),
        "tokens": tokens,
        "end_to_end_s": wall,
        "end_to_end_tokens_per_s": tokens / wall,
        "stages": {
            rule: {**stage_figures(run, rule), "span_s": stage_span(run, rule)}
            for rule in sorted(p.name for p in (run / "logs").iterdir() if p.is_dir())
        },
        "bytes_on_disk_per_token": {k: v / tokens for k, v in disk.items()},
        "bytes_on_disk": disk,
        "bare_pyarrow_gigatoken": {
            **bare,
            "threads": cores,
            "tokens_per_s": bare["tokens"] / bare["seconds"],
        },
        # The merged dataset has one EOD per document more than the bare count.
        "ratio_end_to_end_to_bare": (tokens - bare["documents"])
        / wall
        / (bare["tokens"] / bare["seconds"]),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
