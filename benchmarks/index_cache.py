"""The first segment's start on a multi-GB dataset, with and without the prebuilt index cache.

Writes a synthetic tokenized dataset (``--gb`` GB of uint16 tokens, documents of random
length around ``--doc-tokens``) in Megatron's ``.bin/.idx`` format, builds the index cache
as the ``prepare_data_cache`` rule does (Megatron Core's builder, the torch engine's
key, Megatron's sample counts for a run that reads the whole dataset once), then starts
the torch engine for one iteration twice: reading that cache, and with an empty cache
folder (what a GPU job without the rule would do). Prints the cache build time and each
start's time to its first iteration, and whether its log shows an index build.

    python benchmarks/index_cache.py --gb 2 --dir /scratch/tmp/index-bench
    python benchmarks/index_cache.py --gb 0.01   # a smoke run (tests)
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from hpcllm.text.indexed_dataset import write_index
from hpcllm.training.plan.data import Blend, build_datasets, sample_counts

VOCAB = 8192
EOD = VOCAB - 1


def write_dataset(prefix: Path, tokens: int, doc_tokens: int, seed: int = 1) -> int:
    """Random documents of about ``doc_tokens`` tokens, each ending with EOD; in chunks."""
    rng = np.random.default_rng(seed)
    lengths = []
    written = 0
    with open(f"{prefix}.bin", "wb") as out:
        while written < tokens:
            n = int(min(tokens - written, 64 << 20))
            chunk = rng.integers(0, EOD, size=n, dtype=np.uint16)
            doc = rng.integers(doc_tokens // 2, doc_tokens * 3 // 2, size=n // doc_tokens + 2)
            ends = np.cumsum(doc)
            ends = ends[ends < n]
            chunk[ends - 1] = EOD
            out.write(chunk.tobytes())
            lengths.extend(np.diff(np.concatenate([[0], ends, [n]])).tolist())
            written += n
    lengths = [x for x in lengths if x > 0]
    write_index(
        f"{prefix}.idx", np.dtype(np.uint16), np.array(lengths), np.arange(len(lengths) + 1)
    )
    return len(lengths)


def engine_start(
    work: Path, prefix: Path, cache: Path, train_iters: int, args
) -> tuple[float, str]:
    """Seconds from launch to the first iteration line; the engine's log."""
    vocab = work / "vocab.json"
    vocab.write_text(json.dumps({**{f"t{i}": i for i in range(EOD)}, "<|endoftext|>": EOD}))
    argv = [
        sys.executable, "-m", "hpcllm.training.engines.torch_engine",
        "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", str(args.seq), "--micro-batch-size", "1",
        "--global-batch-size", str(args.global_batch), "--train-iters", str(train_iters),
        "--exit-interval", "1", "--lr", "1e-3", "--data-path", str(prefix),
        "--split", "99,1,0", "--eval-interval", str(train_iters), "--eval-iters", "1",
        "--data-cache-path", str(cache), "--vocab-file", str(vocab), "--log-interval", "1",
        "--threads", "1",
    ]  # fmt: skip
    started = time.time()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    first = None
    for line in proc.stdout:
        lines.append(line)
        if first is None and re.search(r"iteration +1/", line):
            first = time.time() - started
    proc.wait()
    if proc.returncode != 0 or first is None:
        raise SystemExit("".join(lines[-40:]))
    return first, "".join(lines)


def main(argv: list[str] | None = None) -> dict[str, float | bool]:
    """Prints the figures; returns them (seconds, and whether each start built an index)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--gb", type=float, default=2.0, help="dataset size in GB (uint16 tokens)")
    p.add_argument("--doc-tokens", type=int, default=1000, help="mean document length in tokens")
    p.add_argument("--seq", type=int, default=1024, help="sequence length of the training run")
    p.add_argument(
        "--global-batch", type=int, default=8, help="global batch size (sequences per iteration)"
    )
    p.add_argument("--dir", default="index-cache-bench", help="scratch folder (deleted first)")
    args = p.parse_args(argv)
    import torch.distributed as dist

    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    prefix = work / "synthetic_text_document"
    tokens = int(args.gb * 1e9 / 2)
    t = time.time()
    docs = write_dataset(prefix, tokens, args.doc_tokens)
    print(f"dataset: {tokens * 2 / 1e9:.2f} GB, {tokens:,} tokens, {docs:,} documents "
          f"(written in {time.time() - t:.1f} s)")  # fmt: skip
    # A run that reads the training split once: Megatron's sample counts for it.
    train_iters = max(1, int(tokens * 0.99 / (args.seq + 1) / args.global_batch))
    samples = sample_counts(train_iters, args.global_batch, train_iters, 1)
    samples[2] = 0  # the split gives test no share
    cache = work / "cache"
    t = time.time()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        build_datasets(
            Blend((str(prefix),), None), "99,1,0", args.seq, 1234, samples, VOCAB, EOD, cache
        )
    finally:
        dist.destroy_process_group()
    print(f"index cache (the CPU job): {time.time() - t:.1f} s for {samples[0]:,} train samples")
    with_cache, log = engine_start(work, prefix, cache, train_iters, args)
    built_with = "Build and save" in log
    print(
        f"first iteration with the cache: {with_cache:.1f} s after launch; "
        f"index built: {built_with}"
    )
    empty = work / "cache-empty"
    without, log = engine_start(work, prefix, empty, train_iters, args)
    built_without = "Build and save" in log
    print(f"first iteration without it: {without:.1f} s after launch; index built: {built_without}")
    print(
        f"start-up saved by the cache: {without - with_cache:.1f} s ({without / with_cache:.2f}x)"
    )
    shutil.rmtree(work, ignore_errors=True)
    return {
        "with_cache_s": with_cache,
        "without_cache_s": without,
        "built_with_cache": built_with,
        "built_without_cache": built_without,
    }


if __name__ == "__main__":
    main()
