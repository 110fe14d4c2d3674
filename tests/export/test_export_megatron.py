"""Megatron-LM checkpoints exported, checked against the source model's logits.

A real multi-process Megatron Core run on the CPU (4 gloo processes: TP 2 x PP 2,
megatron_ranks.py) builds, for every shipped preset, the model of the command line the
workflow generates for it (LUMI's, ``--transformer-impl local``) scaled down (4 layers,
hidden size 64, 2 or 4 heads as the preset's head size is large or not), perturbs its
weights, saves them with Megatron Core's ``dist_checkpointing`` in the pin's default
format (torch_dist) and in the legacy one (each rank's state dict, ``--ckpt-format
torch``), and runs the pipelined forward on fixed token ids. The export reads each
checkpoint; the folder ``transformers`` loads must give the same logits within
TOLERANCE (absolute, on logits of magnitude ~0.6; float32, the presets' bf16 left out:
it changes the stored dtype, not the mapping).

Not built here: Transformer Engine's layers (no CUDA); Megatron saves them under the
same names the local layers map theirs to (the names read here).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import hang_guard
from test_export_torch import EOD, gpt2_tokenizer
from training.megatron_cases import training_cases, transformer_impl

from hpcllm.export.folder import export
from hpcllm.models.presets import PRESETS
from hpcllm.training.engines.megatron_model import transformer_config_kwargs
from hpcllm.training.plan.settings import write_settings

TOLERANCE = 1e-5
TP, PP = 2, 2
SEQ, VOCAB = 16, 256
REDUCED = {
    "--num-layers": "4", "--hidden-size": "64", "--ffn-hidden-size": "256", "--seq-length": str(SEQ),
    "--max-position-embeddings": str(SEQ), "--tensor-model-parallel-size": str(TP),
    "--pipeline-model-parallel-size": str(PP), "--micro-batch-size": "1", "--global-batch-size": "1",
}  # fmt: skip


def reduced(argv: list[str], heads: int) -> list[str]:
    out = [a for a in argv if a not in ("--bf16", "--fp16")]
    for flag, value in {**REDUCED, "--num-attention-heads": str(heads)}.items():
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


def preset_cases(tmp: Path) -> list[dict]:
    argv = {}
    for case in training_cases(tmp / "cases"):
        if transformer_impl(case) == "local":
            argv.setdefault(case["name"].split()[1], case["argv"])
    assert set(argv) == set(PRESETS), f"no LUMI command line for {set(PRESETS) - set(argv)}"
    cases = []
    gen = torch.Generator().manual_seed(0)
    for preset, line in argv.items():
        model = PRESETS[preset]["model"]
        heads = 2 if model["hidden_size"] // model["num_attention_heads"] >= 256 else 4
        small = reduced(line, heads)
        position = small[small.index("--position-embedding-type") + 1]
        cases.append({
            "name": preset, "config": transformer_config_kwargs(small), "vocab": VOCAB,
            "max_positions": SEQ, "position_embedding_type": position, "heads": heads,
            "save": str(tmp / preset / "checkpoints" / "iter_0000003"), "iteration": 3,
            "legacy": str(tmp / preset / "legacy" / "iter_0000003"),
            "tokens": torch.randint(0, VOCAB, (2, SEQ), generator=gen).tolist(),
            "logits": str(tmp / preset / "logits.pt"),
        })  # fmt: skip
    return cases


@pytest.fixture(scope="module")
def megatron_run(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("megatron")
    cases = preset_cases(tmp)
    request = tmp / "request.json"
    request.write_text(json.dumps({"tp": TP, "pp": PP, "cases": cases}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WORLD_SIZE": str(TP * PP), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}  # fmt: skip
    ranks = [
        subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("megatron_ranks.py")), str(request)],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(TP * PP)
    ]
    outputs = [r.communicate(timeout=hang_guard(60))[0] for r in ranks]
    failed = [
        f"rank {i}:\n{out[-3000:]}"
        for i, (r, out) in enumerate(zip(ranks, outputs))
        if r.returncode
    ]
    assert not failed, "\n".join(failed)
    for case in cases:
        for save in (Path(case["save"]).parent, Path(case["legacy"]).parent):
            (save / "latest_checkpointed_iteration.txt").write_text("3\n")
            write_settings(save, weights(case), {})
    return cases


def weights(case: dict) -> dict:
    return {
        "engine": "megatron",
        "model.num_attention_heads": case["heads"],
        "model.position_embedding": case["position_embedding_type"],
        "model.seq_length": SEQ,
    }


@pytest.mark.parametrize("ckpt_format", ["torch_dist", "torch"])
@pytest.mark.parametrize("preset", list(PRESETS))
def test_megatron_tp2_pp2_export_gives_the_source_logits(
    megatron_run, preset, ckpt_format, tmp_path
):
    import transformers

    case = next(c for c in megatron_run if c["name"] == preset)
    source = case["save"] if ckpt_format == "torch_dist" else case["legacy"]
    save = Path(source).parent
    record = tmp_path / "seg1.json"
    record.write_text(json.dumps({"segment": 1, "last_iteration": 3, "consumed_samples": 6}))
    tokenizer = gpt2_tokenizer(tmp_path / "tok")
    out = tmp_path / "export"
    info = export(preset, record, save, weights(case), tokenizer, EOD, out)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    rope = case["position_embedding_type"] == "rope"
    assert type(model).__name__ == ("GPTNeoXForCausalLM" if rope else "GPT2LMHeadModel")
    with torch.no_grad():
        got = model(input_ids=torch.tensor(case["tokens"])).logits
    want = torch.load(case["logits"])
    assert want.shape == got.shape == (2, SEQ, VOCAB)
    assert (want - got).abs().max().item() <= TOLERANCE
    assert want.abs().max().item() > 100 * TOLERANCE  # not trivially small
    assert info["engine"] == "megatron" and info["iteration"] == 3 and info["tokens"] == 6 * SEQ
    assert info["source_checkpoint"] == source
    assert transformers.AutoTokenizer.from_pretrained(str(out)).eos_token == EOD
