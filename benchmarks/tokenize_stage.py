"""The tokenize stage on one FineWeb-shaped Parquet file, against what bounds it.

Generates (or reuses) one Parquet file with FineWeb's columns in ``--workdir`` (the
generator of benchmarks/fineweb_scale.py: snappy, row groups of 64 MB of text, shuffled
words so that it compresses like web text) and a 32k byte-level BPE trained on part of it,
then measures in rounds, every tool in a fresh process with ``--cores`` threads:

- bare encode: gigatoken's ``encode_batch`` on the text already in memory (one call per
  row group), which is the fastest way to the same ids;
- bare read: pyarrow decoding the text column (Arrow arrays, no Python strings), and its
  CPU seconds;
- gigatoken's own file path: ``encode_files(ParquetFileSource)``, its Rust reader and
  encoder in one call (reading and encoding on the same cores, no checks, no writing);
- the stage: ``tokenize_source_shard`` on a ``type: local`` source of the file, as a
  ``tokenize`` job runs it (reading in place, the bad-record policy, the check against HF
  tokenizers, end-of-document ids, the ``.bin/.idx`` written), with what loading gigatoken
  and the check's calls took inside it, and the same stage with the check switched off
  (the check runs beside the encoding: what it adds is the difference, not its calls'
  wall time).

Prints every round and the medians: the stage's rate against bare encode (issue 22's 0.8
target), against bare read + bare encode one after the other, and against gigatoken's own
file path, plus the bound reading alone puts on it: encoding takes the cores for the bare
encode's time ``E``; reading costs ``R`` CPU seconds more on the same cores, so no stage
that reads the file can beat ``E + R / cores``, a rate of ``E / (E + R / cores)`` of bare.

Usage: python benchmarks/tokenize_stage.py [--workdir DIR] [--repeat 5] [--cores 2]
       [--text-megabytes 500]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

BARE_ENCODE = """
import json, os, sys, time
os.environ["RAYON_NUM_THREADS"] = sys.argv[2]
import pyarrow.parquet as pq
from hpcllm.text.tokenization import gigatoken_encoder, load_tokenizer, special_handling
tok = load_tokenizer(sys.argv[1])
f = pq.ParquetFile(sys.argv[3])
groups = [f.read_row_group(i, columns=["text"]).column(0).to_pylist()
          for i in range(f.num_row_groups)]
with special_handling(tok, "text"):
    enc = gigatoken_encoder(tok)
enc.encode(groups[0][:50])  # the thread pool started
t = time.perf_counter()
tokens = docs = 0
for g in groups:
    flat, lengths = enc.encode(g)
    tokens += len(flat)
    docs += len(lengths)
print(json.dumps({"tokens": tokens, "documents": docs, "seconds": time.perf_counter() - t,
                  "bytes": sum(len(x.encode()) for g in groups for x in g)}))
"""

BARE_READ = """
import json, sys, time, resource
import pyarrow.parquet as pq
cpu = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_utime + resource.getrusage(
    resource.RUSAGE_SELF).ru_stime
t, c = time.perf_counter(), cpu()
f = pq.ParquetFile(sys.argv[1])
rows = 0
for i in range(f.num_row_groups):
    for batch in f.iter_batches(batch_size=4096, row_groups=[i], columns=["text"]):
        batch.column(0).validate(full=True)  # the UTF-8 check the stage makes
        rows += batch.num_rows
print(json.dumps({"seconds": time.perf_counter() - t, "cpu_s": cpu() - c, "rows": rows}))
"""

GIGATOKEN_FILES = """
import json, os, sys, time
os.environ["RAYON_NUM_THREADS"] = sys.argv[2]
import awkward as ak, gigatoken
from hpcllm.text.tokenization import gigatoken_encoder, load_tokenizer, special_handling
tok = load_tokenizer(sys.argv[1])
with special_handling(tok, "text"):
    gigatoken_encoder(tok)  # the same tokenizer JSON as the stage's
data = tok.to_str()
import orjson
config = orjson.loads(data)
config["added_tokens"] = []
gt = gigatoken.Tokenizer.from_json(orjson.dumps(config))
gt.encode_batch(["the thread pool started"] * 8)
t = time.perf_counter()
ids = gt.encode_files(gigatoken.ParquetFileSource([sys.argv[3]], column="text"))
tokens = len(ak.flatten(ids))
print(json.dumps({"tokens": tokens, "seconds": time.perf_counter() - t}))
"""

STAGE = """
import json, os, sys, time
os.environ["RAYON_NUM_THREADS"] = sys.argv[4]
import hpcllm.text.tokenization as t
from hpcllm.text.shards import source_policy, tokenize_source_shard
spent = {"check": 0.0, "load": 0.0}
def timed(f, key):
    def g(*a, **k):
        start = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[key] += time.perf_counter() - start
    return g
t.same_ids = timed(t.same_ids, "check")
t.differing_document = timed(t.differing_document, "check")
if sys.argv[5] == "nocheck":  # the stage without any comparison with HF (measuring only)
    t.same_ids = lambda *a: True
    t.SampledCheck.pick = lambda self, texts: ([], None)
t.load_fast_encoder = timed(t.load_fast_encoder, "load")
stats = []
tokenize_shard = t.tokenize_shard
t.tokenize_shard = lambda *a, **k: stats.append(tokenize_shard(*a, **k))
tok = t.load_tokenizer(sys.argv[1])
cfg = {"type": "local", "files": [sys.argv[2]]}
start = time.perf_counter()
tokenize_source_shard(
    "stage", cfg, source_policy(cfg, {}, 0, 1), 0, 1, sys.argv[3], sys.argv[3] + ".json",
    tok, "<|endoftext|>",
)
print(json.dumps({"tokens": stats[0].tokens, "seconds": time.perf_counter() - start,
                  "check_s": spent["check"], "load_s": spent["load"],
                  "encoder": stats[0].encoder}))
"""


def py(code: str, *args) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True)
    if proc.returncode:
        raise SystemExit(f"failed: {code[:80]!r}\n{proc.stderr.decode()[-3000:]}")
    return json.loads(proc.stdout)


def prepare(work: Path, text_bytes: int) -> tuple[Path, Path]:
    """One FineWeb-shaped Parquet file of about ``text_bytes`` of text and a 32k BPE."""
    import orjson
    import pyarrow.parquet as pq
    from fineweb_scale import build_mirror
    from text_volume import train_tokenizer

    # build_mirror sizes files by Parquet bytes: the shuffled text compresses about 1.96x.
    (path,) = build_mirror(work / "parquet", int(text_bytes / 1.96), 1, 64_000_000)
    sample = work / "tokenizer-sample.jsonl"
    if not sample.exists():
        texts = pq.ParquetFile(path).read_row_group(0, columns=["text"]).column(0).to_pylist()
        sample.write_bytes(b"".join(orjson.dumps({"text": x}) + b"\n" for x in texts))
    return path, train_tokenizer(sample, work / "tokenizer")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--workdir",
        type=Path,
        default=Path("/tmp/hpcllm-tokenize-stage"),
        help="the generated Parquet file, the tokenizer and the outputs (default: %(default)s)",
    )
    ap.add_argument("--repeat", type=int, default=5, help="rounds (medians)")
    ap.add_argument("--cores", type=int, default=2, help="threads every tool gets")
    ap.add_argument("--text-megabytes", type=float, default=500, help="text in the file")
    args = ap.parse_args(argv)
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    path, tok = prepare(work, int(args.text_megabytes * 1e6))
    print(f"file: {path} ({path.stat().st_size / 1e9:.2f} GB of Parquet); tokenizer {tok}")
    rounds = []
    for r in range(args.repeat):
        row: dict = {"load_1min": os.getloadavg()[0]}
        enc = py(BARE_ENCODE, tok, args.cores, path)
        read = py(BARE_READ, path)
        files = py(GIGATOKEN_FILES, tok, args.cores, path)
        # The stage, and the same without the check against HF (in turns: first one, then
        # the other), whose difference is what the check adds (it runs beside the
        # encoding, so its calls' own wall time overstates its cost).
        runs = {}
        for mode in ("check", "nocheck")[:: 1 if r % 2 == 0 else -1]:
            runs[mode] = py(STAGE, tok, path, work / f"{mode}_text_document", args.cores, mode)
        stage, bare_stage = runs["check"], runs["nocheck"]
        rate = enc["tokens"] / enc["seconds"]
        # The stage writes one end-of-document id per document more: the same text.
        stage_rate = (stage["tokens"] - enc["documents"]) / stage["seconds"]
        row |= {
            "bare_encode_s": enc["seconds"],
            "bare_read_s": read["seconds"],
            "bare_read_cpu_s": read["cpu_s"],
            "gigatoken_files_s": files["seconds"],
            "stage_s": stage["seconds"],
            "stage_load_s": stage["load_s"],
            "stage_check_s": stage["check_s"],
            "stage_vs_bare_encode": stage_rate / rate,
            "stage_vs_read_then_encode": (enc["seconds"] + read["seconds"]) / stage["seconds"],
            "stage_vs_gigatoken_files": files["seconds"] / stage["seconds"],
            "gigatoken_files_vs_bare_encode": enc["seconds"] / files["seconds"],
            "bound_from_reading": enc["seconds"] / (enc["seconds"] + read["cpu_s"] / args.cores),
            "check_calls_share_of_stage": stage["check_s"] / stage["seconds"],
            "stage_without_check_s": bare_stage["seconds"],
            "check_added_share_of_stage": (stage["seconds"] - bare_stage["seconds"])
            / stage["seconds"],
        }
        assert files["tokens"] == enc["tokens"], "gigatoken's file path gave other ids"
        rounds.append(row)
        print(json.dumps({"round": r, **{k: round(v, 3) for k, v in row.items()}}), flush=True)
    med = {k: statistics.median(x[k] for x in rounds) for k in rounds[0]}
    print(
        f"corpus: {enc['bytes'] / 1e6:.0f} MB of text, {enc['documents']} documents, "
        f"{enc['tokens'] / 1e6:.1f} M tokens; encoder {stage['encoder']}; {args.cores} cores"
    )
    rate = enc["tokens"] / med["bare_encode_s"]
    print(f"bare encode: {rate / 1e6:.1f} M tokens/s (median {med['bare_encode_s']:.2f} s)")
    for key, value in med.items():
        print(f"{key:32s} median {value:7.3f}  rounds {[round(x[key], 3) for x in rounds]}")
    return {"medians": med, "rounds": rounds}


if __name__ == "__main__":
    main()
