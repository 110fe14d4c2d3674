"""Peak GPU memory of real Megatron-LM runs against the project's memory model.

Runs the pinned Megatron-LM's ``pretrain_gpt.py`` (``--megatron``: its tree) on one GPU for
a few small but real GPT configurations, with the command line the project's segments use
(:func:`hpcllm.models.megatron_args.pretrain_gpt_args`: Megatron's local layers, as on a
machine without Transformer Engine or Apex; mock data, no checkpoint), and prints for each
the peak memory Megatron reports (its ``report_memory`` lines: torch.cuda's max allocated
and max reserved after the optimizer's first steps) against the planner's estimate for the
same settings (:func:`hpcllm.models.planner.estimate_memory` of the experiment as it runs,
:func:`hpcllm.models.megatron_args.as_run`) and Megatron's own theoretical figure.

    python benchmarks/gpu_memory_model.py --megatron /path/to/Megatron-LM
    python benchmarks/gpu_memory_model.py --megatron shared/reference/megatron-lm-core_v0.19.0 --only 350m

On the lent GPU machine (the device tool: the working tree is copied, nothing is
installed there): copy the pinned tree into an ignored folder and carry it (11 MB):

    cp -r ../shared/reference/megatron-lm-core_v0.19.0 data/megatron-lm      # /data/ is ignored
    run(command="python3 benchmarks/gpu_memory_model.py --megatron data/megatron-lm
        --json $OUT/gpu_memory.json --logs $OUT/logs", carry=["data/megatron-lm"],
        timeout_s=420)

Each run is ended after ``--timeout`` seconds (110 by default: three runs within about
5.5 minutes at worst); ``--only 350m 1.3b`` runs two.

Without a CUDA device it prints the configurations, the estimates and the command lines,
says it skipped the runs, and exits 0 (a check of the paths and the arguments). On one
GPU DP is 1, so the distributed optimizer divides nothing: the model then predicts the
same states with and without it (18 bytes per parameter in bf16), which the pair of runs
checks.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from hpcllm.models.megatron_args import as_run, pretrain_gpt_args  # noqa: E402
from hpcllm.models.planner import Layout, estimate_memory  # noqa: E402
from hpcllm.models.presets import resolve_experiment  # noqa: E402

VOCAB = 50257  # Megatron's NullTokenizer over mock data, GPT-2's size
ITERATIONS = 3  # memory is reported after iterations 1 and 2 (optimizer state made)
# name: (layers, hidden, heads, micro batch, global batch, distributed optimizer)
CONFIGS = {
    "350m": (24, 1024, 16, 4, 8, False),
    "350m-distopt": (24, 1024, 16, 4, 8, True),
    "1.3b": (24, 2048, 16, 2, 4, False),
}
SEQ = 2048
MIB = 1024 * 1024
GB = 1e9


def experiment(name: str) -> tuple[dict, Layout]:
    layers, hidden, heads, micro, glob, distopt = CONFIGS[name]
    exp = resolve_experiment(
        name,
        {
            "engine": "megatron",
            "model": {
                "num_layers": layers,
                "hidden_size": hidden,
                "num_attention_heads": heads,
                "seq_length": SEQ,
                "flash_attention": False,  # TE's; the local layers keep the score matrix
            },
            "layout": {"tp": 1, "pp": 1, "distributed_optimizer": distopt},
            "batch": {"micro": micro, "global": glob},
            "precision": "bf16",
            "optim": {"warmup_iters": 0},
            "log_interval": 1,
            "eval_iters": 0,
        },
    )
    return exp, Layout(1, 1, 1, 1, micro, glob)


def estimate(name: str) -> dict[str, float]:
    exp, layout = experiment(name)
    runs, _ = as_run(exp, "local")  # what runs without TE (no resume: the optimizer kept)
    m = estimate_memory(runs, layout, VOCAB)
    return {
        "parameters_b": m.parameters,
        "states_gb": m.states,
        "activations_gb": m.activations,
        "total_gb": m.total,
    }


def command(name: str, megatron: Path) -> list[str]:
    exp, layout = experiment(name)
    args = pretrain_gpt_args(
        exp, layout, data_path=None, split="99,1,0", save=None, tensorboard_dir=None,
        data_cache_path=None, train_iters=ITERATIONS, stop_iteration=ITERATIONS,
        exit_minutes=None, transformer_impl="local",
    )  # fmt: skip
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*launcher, "--nproc_per_node", "1", str(megatron / "pretrain_gpt.py"), *args]


MEMORY = re.compile(
    r"max allocated: (?P<alloc>[\d.]+) \| reserved: [\d.]+ \| max reserved: (?P<res>[\d.]+)"
)
THEORY = re.compile(r"Theoretical memory footprints: .*?total=(?P<total>[\d.]+) MB")


def measure(name: str, megatron: Path, timeout_s: float, log_dir: Path) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(megatron), os.environ.get("PYTHONPATH", "")]),
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    log = log_dir / f"{name}.log"
    started = time.time()
    try:
        proc = subprocess.run(
            command(name, megatron), env=env, capture_output=True, text=True, timeout=timeout_s
        )
        text, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode() + (e.stderr or b"").decode()
        rc = "timed out"
    log.write_text(text)
    peaks = [(float(m["alloc"]), float(m["res"])) for m in MEMORY.finditer(text)]
    theory = THEORY.search(text)
    return {
        "rc": rc,
        "seconds": round(time.time() - started, 1),
        "log": str(log),
        "max_allocated_gb": max(p[0] for p in peaks) * MIB / GB if peaks else None,
        "max_reserved_gb": max(p[1] for p in peaks) * MIB / GB if peaks else None,
        "megatron_theory_gb": float(theory["total"]) * MIB / GB if theory else None,
        "tail": None if peaks else text[-1500:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megatron", type=Path, required=True, help="Megatron-LM's tree")
    parser.add_argument("--only", nargs="*", choices=sorted(CONFIGS), help="configurations")
    parser.add_argument("--timeout", type=float, default=110, help="seconds per run")
    parser.add_argument("--logs", type=Path, default=None, help="folder for the runs' logs")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    a = parser.parse_args()
    megatron = a.megatron.resolve()
    if not (megatron / "pretrain_gpt.py").is_file():
        print(f"--megatron {megatron}: no pretrain_gpt.py there (a Megatron-LM tree)")
        return 2
    import torch

    gpu = torch.cuda.is_available()
    logs = a.logs or Path(tempfile.mkdtemp(prefix="gpu_memory_model-"))
    logs.mkdir(parents=True, exist_ok=True)
    names = a.only or list(CONFIGS)
    results = {}
    print(f"{'config':<14} {'params':>7} {'model':>8} {'(states':>8} {'act)':>6} "
          f"{'max alloc':>10} {'max resv':>9} {'megatron':>9} {'alloc/model':>11}")  # fmt: skip
    for name in names:
        est = estimate(name)
        row = {"estimate": est, "command": command(name, megatron)}
        if gpu:
            row["measured"] = measure(name, megatron, a.timeout, logs)
        results[name] = row
        got = row.get("measured", {})
        alloc, resv = got.get("max_allocated_gb"), got.get("max_reserved_gb")
        theory = got.get("megatron_theory_gb")

        def gb(x: float | None) -> str:
            return f"{x:.2f}GB" if x is not None else "-"

        ratio = f"{alloc / est['total_gb']:.2f}" if alloc else "-"
        print(
            f"{name:<14} {est['parameters_b']:>6.2f}B {gb(est['total_gb']):>8} "
            f"{gb(est['states_gb']):>8} {gb(est['activations_gb']):>6} {gb(alloc):>10} "
            f"{gb(resv):>9} {gb(theory):>9} {ratio:>11}"
        )
        if got and got.get("tail"):
            print(f"  {name}: no memory report (rc {got['rc']}); log {got['log']}:\n{got['tail']}")
    if not gpu:
        print("skipped the runs: no CUDA device here. Commands:")
        for name in names:
            print("  " + " ".join(results[name]["command"]))
    else:
        print(f"logs: {logs}; GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
