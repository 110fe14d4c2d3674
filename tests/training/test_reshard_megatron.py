"""A Megatron checkpoint saved at TP=2 resumes at TP=1: Megatron Core's own
``dist_checkpointing`` on the CPU (hpcllm.training.plan.reshard, first point).

Two gloo processes (tests/export/megatron_ranks.py) build a small GPTModel with
Megatron's local layers at TP=2, perturb its weights, save them as Megatron-LM's
``save_checkpoint`` does (``torch_dist``, the model's sharded state dict) and run a
forward on fixed tokens; one process at TP=1 (megatron_reshard_load.py) loads that
checkpoint into its own model and must give the same logits. The optimizer states are
not built here: without the distributed optimizer they are keyed by the same sharded
tensors (optimizer.py:1138-1189 at the pin); the distributed optimizer's formats are the
plan-time check's (test_settings.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
from support import hang_guard

TOLERANCE = 1e-5
SEQ, VOCAB = 16, 128
HERE = Path(__file__).resolve().parent


def run_ranks(script: Path, args: list[str], world: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}  # fmt: skip
    ranks = [
        subprocess.Popen([sys.executable, str(script), *args], env={**env, "RANK": str(r)},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world)
    ]  # fmt: skip
    outputs = [r.communicate(timeout=hang_guard(30))[0] for r in ranks]
    failed = [
        f"rank {i}:\n{o[-3000:]}" for i, (r, o) in enumerate(zip(ranks, outputs)) if r.returncode
    ]
    assert not failed, "\n".join(failed)


def test_a_tp2_checkpoint_loads_at_tp1_with_the_same_logits(tmp_path):
    config = {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 256,
              "num_attention_heads": 4, "params_dtype": "torch.float32"}  # fmt: skip
    case = {
        "name": "tp2", "config": config, "vocab": VOCAB, "max_positions": SEQ,
        "position_embedding_type": "rope", "save": str(tmp_path / "iter_0000004"),
        "legacy": str(tmp_path / "legacy"), "iteration": 4,
        "tokens": torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0)).tolist(),
        "logits": str(tmp_path / "tp2_logits.pt"),
    }  # fmt: skip
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"tp": 2, "pp": 1, "cases": [case]}))
    run_ranks(HERE.parent / "export" / "megatron_ranks.py", [str(request)], world=2)
    tp1 = tmp_path / "tp1_logits.pt"
    run_ranks(HERE / "megatron_reshard_load.py", [str(request), str(tp1)], world=1)
    want, got = torch.load(case["logits"]), torch.load(tp1)
    assert want.shape == got.shape == (2, SEQ, VOCAB)
    assert want.abs().max().item() > 100 * TOLERANCE  # not trivially small
    assert (want - got).abs().max().item() <= TOLERANCE
