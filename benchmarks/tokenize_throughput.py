"""Throughput and memory of the tokenize stage, against bare HF tokenizers and gigatoken.

Builds an English corpus offline (pydoc, man pages, /usr/share/doc; see
hpcllm.text.sample_corpus), trains a 32k byte-level BPE on part of it, then prints:
- tokens/s of the tokenize stage end to end (read JSONL.zst, encode, write .bin/.idx),
  of bare HF ``encode_batch`` and of gigatoken alone, on texts already in memory;
- the stage's ratio to bare HF (measured in the same run);
- the stage's peak RSS on a ~50 MB and a ~200 MB shard (each in a fresh process);
- merge_tokenized against ``cat`` of the same bytes.
Medians of --repeat runs. Usage: python benchmarks/tokenize_throughput.py [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

STAGE = """
import os, sys
os.environ["RAYON_NUM_THREADS"] = sys.argv[4]
from hpcllm.text.tokenization import load_tokenizer, tokenize_shard
tok = load_tokenizer(sys.argv[1])
s = tokenize_shard(sys.argv[2], sys.argv[3], tok, "<|endoftext|>")
# VmHWM, not ru_maxrss: after fork+exec ru_maxrss still counts the parent's peak.
rss = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) / 1024
print(s.tokens, s.seconds, rss, s.encoder)
"""


def corpus(path: Path, target_bytes: int) -> Path:
    from hpcllm.text.sample_corpus import english_documents, take_bytes, write_jsonl_zst

    if not path.exists():
        t = time.monotonic()
        n = write_jsonl_zst(take_bytes(english_documents, target_bytes), path)
        print(f"built {path.name}: {n} documents in {time.monotonic() - t:.0f} s", flush=True)
    return path


def run_stage(tok: Path, shard: Path, out: Path, threads: int) -> tuple:
    """One tokenize job in a fresh process: tokens, seconds in the stage, peak RSS (MB),
    encoder, and the process's wall time (Python start-up, imports, tokenizer load too)."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", STAGE, str(tok), str(shard), str(out), str(threads)],
        check=True,
        capture_output=True,
        text=True,
    )
    tokens, seconds, rss, encoder = proc.stdout.split()
    return int(tokens), float(seconds), float(rss), encoder, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workdir",
        default="/tmp/hpcllm-tokenize-bench",
        help="folder of the corpus, tokenizer and outputs (kept between runs)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (medians)")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 2, help="encoder threads (all cores)"
    )
    parser.add_argument(
        "--vocab-size", type=int, default=32000, help="vocabulary of the BPE trained for it"
    )
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    small = corpus(work / "en50.jsonl.zst", 50_000_000)
    large = corpus(work / "en200.jsonl.zst", 200_000_000)

    from hpcllm.text.tokenization import gigatoken_encoder, load_tokenizer, read_texts
    from hpcllm.text.tokenizer_train import train_bpe

    tok_path = work / "bpe32k" / "tokenizer.json"
    if not tok_path.exists():
        t = time.monotonic()
        train_bpe(
            [small], work / "bpe32k", args.vocab_size, ["<|endoftext|>"], sample_documents=4000
        )
        print(f"trained a {args.vocab_size} BPE in {time.monotonic() - t:.0f} s", flush=True)
    tok = load_tokenizer(tok_path)
    texts = [t for b in read_texts(small, 1 << 24) for t in b]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print(
        f"corpus: {len(texts)} documents, {mb:.1f} MB; {args.threads} threads; vocab {tok.get_vocab_size()}"
    )

    hf, gt, stage, wall, ratios = [], [], [], [], []
    hf_ids_checked = False
    for _ in range(args.repeat):
        t = time.perf_counter()
        encs = tok.encode_batch(texts, add_special_tokens=False)
        hf_s = time.perf_counter() - t
        n_tokens = sum(len(e.ids) for e in encs)
        enc = gigatoken_encoder(tok)
        t = time.perf_counter()
        flat, lengths = enc.encode(texts)
        gt_s = time.perf_counter() - t
        if not hf_ids_checked:  # the speed counts only if the ids are HF's, every one
            reference = np.fromiter((i for e in encs for i in e.ids), np.int64, n_tokens)
            same = np.array_equal(lengths, [len(e.ids) for e in encs]) and np.array_equal(
                flat, reference
            )
            print(
                f"gigatoken ids identical to HF tokenizers' on all {len(texts)} documents: {same}"
            )
            hf_ids_checked = True
        del encs
        tokens, seconds, _, encoder, wall_s = run_stage(
            tok_path, small, work / "out_text_document", args.threads
        )
        hf.append(n_tokens / hf_s)
        gt.append(n_tokens / gt_s)
        stage.append(tokens / seconds)
        wall.append(tokens / wall_s)
        ratios.append(hf_s / seconds * tokens / n_tokens)
    med = statistics.median
    print(
        f"tokens: {n_tokens:,} (stage wrote {tokens:,} incl. one EOD per document; encoder {encoder})"
    )
    print(f"bare HF encode_batch        {med(hf) / 1e6:6.2f} M tokens/s")
    print(f"gigatoken alone             {med(gt) / 1e6:6.2f} M tokens/s")
    print(f"tokenize stage end to end   {med(stage) / 1e6:6.2f} M tokens/s  (target >= 5)")
    print(
        f"  the same, whole process   {med(wall) / 1e6:6.2f} M tokens/s  (with start-up, imports)"
    )
    print(
        f"stage / bare HF (same run)  {med(ratios):6.2f} x  (per run: {', '.join(f'{r:.2f}' for r in ratios)})"
    )
    for shard in (small, large):
        tokens, seconds, rss, _, _ = run_stage(
            tok_path, shard, work / "rss_text_document", args.threads
        )
        print(
            f"peak RSS, {shard.stat().st_size / 1e6:5.0f} MB zst shard ({tokens / 1e6:.0f} M tokens): "
            f"{rss:6.0f} MB at {tokens / seconds / 1e6:.2f} M tokens/s  (target < 1000, flat)"
        )
    bench_merge(work, tok_path, large, args)


def fresh(*paths: Path) -> None:
    for p in paths:
        p.unlink(missing_ok=True)
    os.sync()


def bench_merge(work: Path, tok_path: Path, shard: Path, args) -> None:
    """merge_tokenized of 4 shards against `cat` of the same .bin files, warm cache."""
    from hpcllm.text.indexed_dataset import merge_datasets

    prefixes = []
    for i in range(4):
        prefix = work / f"merge{i}_text_document"
        if not Path(f"{prefix}.bin").exists():
            run_stage(tok_path, shard, prefix, args.threads)
        prefixes.append(str(prefix))
    size = sum(Path(f"{p}.bin").stat().st_size for p in prefixes)
    ours, cat = [], []
    for _ in range(args.repeat):
        # Both write fresh files (replacing a large existing file costs extra).
        fresh(work / "merged_text_document.bin", work / "merged_text_document.idx")
        t = time.perf_counter()
        merge_datasets(prefixes, work / "merged_text_document")
        ours.append(time.perf_counter() - t)
        fresh(work / "cat.bin")
        t = time.perf_counter()
        with open(work / "cat.bin", "wb") as out:
            subprocess.run(["cat", *[f"{p}.bin" for p in prefixes]], stdout=out, check=True)
        cat.append(time.perf_counter() - t)
    m_ours, m_cat = statistics.median(ours), statistics.median(cat)
    print(
        f"merge_tokenized: {size / 1e6:.0f} MB in {m_ours:.2f} s ({size / m_ours / 1e6:.0f} MB/s); "
        f"cat: {m_cat:.2f} s ({size / m_cat / 1e6:.0f} MB/s); ratio {m_cat / m_ours:.2f} of cat's "
        "throughput (target >= 0.8)"
    )


if __name__ == "__main__":
    main()
