"""Throughput of the torch engine: tokens/s, TFLOP/s per GPU and MFU.

Runs ``python -m hpcllm.training.engines.torch_engine`` on Megatron's mock data with log interval
1, drops the warm-up iterations and prints the medians of the rest, computed from the
engine's own Megatron-format log lines (the same FLOP count as Megatron-LM).

    # A GPU: a ~800M Llama at sequence 2048, bf16 (PyTorch SDPA flash attention)
    python benchmarks/train_throughput.py --layers 16 --hidden 2048 --heads 16 \
        --seq 2048 --micro-batch 4 --bf16
    # The CPU (kept working in CI-sized form)
    python benchmarks/train_throughput.py --cpu

MFU is against the dense bf16 peak of the GPU (``--peak-tflops``; known for H100/H200/A100).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

from hpcllm.models.planner import pad_vocab
from hpcllm.training.engines.log_lines import parse_log_lines
from hpcllm.training.engines.torch_engine import flops_per_iteration

# Dense bf16 tensor-core peaks (TFLOP/s) of the SXM parts.
PEAKS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "GH200": 989.0}


def gpu_peak() -> tuple[str, float | None]:
    import torch

    if not torch.cuda.is_available():
        return "cpu", None
    name = torch.cuda.get_device_name()
    for key, peak in PEAKS.items():
        if key in name:
            return name, peak
    return name, None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="a small model on the CPU")
    p.add_argument("--layers", type=int, default=16, help="transformer layers")
    p.add_argument("--hidden", type=int, default=2048, help="hidden size")
    p.add_argument("--heads", type=int, default=16, help="attention heads")
    p.add_argument("--seq", type=int, default=2048, help="sequence length")
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per GPU per step")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per iteration")
    p.add_argument("--steps", type=int, default=30, help="iterations run (warm-up included)")
    p.add_argument("--warmup", type=int, default=5, help="iterations left out of the medians")
    p.add_argument(
        "--vocab", type=int, default=50257, help="vocabulary size (padded as Megatron pads it)"
    )
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision (default fp32)")
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the GPU's peak TFLOP/s for the MFU (default: from a table of known GPUs)",
    )
    args = p.parse_args(argv)
    if args.cpu:
        args.layers, args.hidden, args.heads, args.seq = 2, 128, 4, 128
        args.micro_batch, args.steps, args.warmup, args.vocab = 4, 8, 2, 8192
    device, peak = gpu_peak()
    peak = args.peak_tflops or peak
    cmd = [
        sys.executable, "-m", "hpcllm.training.engines.torch_engine",
        "--num-layers", str(args.layers), "--hidden-size", str(args.hidden),
        "--num-attention-heads", str(args.heads), "--seq-length", str(args.seq),
        "--micro-batch-size", str(args.micro_batch),
        "--global-batch-size", str(args.micro_batch * args.grad_accum),
        "--train-iters", str(args.steps), "--lr", "1e-4", "--mock-data",
        "--vocab-size", str(args.vocab), "--log-interval", "1", "--log-throughput",
        "--device", "cpu" if args.cpu else "auto",
    ] + (["--bf16"] if args.bf16 else [])  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        print(out.stdout[-3000:], out.stderr[-3000:], file=sys.stderr)
        return out.returncode
    rows = parse_log_lines(out.stdout)[args.warmup :]
    if not rows:
        print("no iterations measured", file=sys.stderr)
        return 1
    ms = statistics.median(r["elapsed time per iteration (ms)"] for r in rows)
    # From the engine's FLOP count, not the log's one decimal (too coarse on a CPU).
    shape = argparse.Namespace(
        hidden_size=args.hidden,
        seq_length=args.seq,
        num_layers=args.layers,
        ffn_hidden_size=None,
        position_embedding_type="rope",
        global_batch_size=args.micro_batch * args.grad_accum,
    )
    tflops = flops_per_iteration(shape, pad_vocab(args.vocab, 1)) / (ms / 1000) / 1e12
    tokens = args.micro_batch * args.grad_accum * args.seq / (ms / 1000)
    params = next((line for line in out.stdout.splitlines() if "parameters" in line), "")
    print(f"device: {device}; {params.strip()}")
    print(
        f"layers {args.layers} hidden {args.hidden} heads {args.heads} seq {args.seq} "
        f"micro batch {args.micro_batch} x {args.grad_accum} {'bf16' if args.bf16 else 'fp32'}; "
        f"median of {len(rows)} iterations after {args.warmup} warm-up"
    )
    print(f"time per iteration (ms): {ms:.1f}")
    print(f"tokens/s: {tokens:.0f}")
    print(f"TFLOP/s per GPU: {tflops:.2f}")
    print(f"MFU: {tflops / peak:.1%}" if peak else "MFU: n/a (no known peak; give --peak-tflops)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
