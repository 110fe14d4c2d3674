"""Model and optimizer presets; an experiment names one and overrides what it needs.

Keys are those of an experiment's ``model``, ``optim`` and ``layout`` sections (see
workflow/schemas/training.schema.yaml). Sizes from the sources named in each comment.
"""

from __future__ import annotations

import copy
from typing import Any

# GPT-3 style optimizer (Brown et al. 2020; the OpenGPT-X report's appendix uses the same).
_ADAM_GPT3 = {"beta1": 0.9, "beta2": 0.95, "weight_decay": 0.1, "clip_grad": 1.0}

PRESETS: dict[str, dict[str, Any]] = {
    # A few hundred thousand parameters: the built-in local run and the tests, on a CPU.
    "tiny": {
        "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64},
        "batch": {"micro": 4, "global": 8},
        "optim": {"lr": 3.0e-3, "min_lr": 3.0e-4, "warmup_iters": 2, **_ADAM_GPT3},
        "precision": "fp32",
    },
    # The 800M job of the OpenGPT-X report's appendix: 16 layers, hidden 2048, 8 heads,
    # sequence 2048, micro batch 4, global batch 512, RoPE, flash attention, sequence
    # parallel, bf16, Adam 0.9/0.95, lr 2.5e-4 cosine to 2.5e-5, clip 1.0, wd 0.1,
    # distributed optimizer.
    "opengptx_800m": {
        "model": {
            "num_layers": 16,
            "hidden_size": 2048,
            "num_attention_heads": 8,
            "seq_length": 2048,
            "position_embedding": "rope",
            "flash_attention": True,
        },
        "batch": {"micro": 4, "global": 512},
        "optim": {"lr": 2.5e-4, "min_lr": 2.5e-5, "warmup_iters": 500, **_ADAM_GPT3},
        "layout": {"tp": 2, "pp": 1, "sequence_parallel": True, "distributed_optimizer": True},
        "precision": "bf16",
    },
    # GPT-3 175B (Brown et al. 2020, table 2.1) as in Megatron-LM's
    # examples/gpt3/train_gpt3_175b_distributed.sh: TP 8, PP 16, micro 1, global 1536.
    "gpt3_175b": {
        "model": {
            "num_layers": 96,
            "hidden_size": 12288,
            "num_attention_heads": 96,
            "seq_length": 2048,
            "position_embedding": "learned_absolute",
            "flash_attention": True,
        },
        "batch": {"micro": 1, "global": 1536},
        "optim": {"lr": 6.0e-5, "min_lr": 6.0e-6, "warmup_iters": 2000, **_ADAM_GPT3},
        "layout": {
            "tp": 8,
            "pp": 16,
            "sequence_parallel": True,
            "distributed_optimizer": True,
            "recompute": "selective",
        },
        "precision": "bf16",
    },
    # A GPT-3 style model of about 860M parameters that trains on one GPU (20 layers,
    # hidden 1792, 14 heads of 128: 0.77B in the layers + 0.09B embeddings).
    "gpt3_860m": {
        "model": {
            "num_layers": 20,
            "hidden_size": 1792,
            "num_attention_heads": 14,
            "seq_length": 2048,
            "position_embedding": "learned_absolute",
            "flash_attention": True,
        },
        "batch": {"micro": 4, "global": 256},
        "optim": {"lr": 2.5e-4, "min_lr": 2.5e-5, "warmup_iters": 500, **_ADAM_GPT3},
        "layout": {"tp": 1, "pp": 1},
        "precision": "bf16",
    },
    # GPT-3 6.7B (Brown et al. 2020): 32 layers, hidden 4096, 32 heads.
    "gpt_7b": {
        "model": {
            "num_layers": 32,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "seq_length": 2048,
            "position_embedding": "rope",
            "flash_attention": True,
        },
        "batch": {"micro": 1, "global": 512},
        "optim": {"lr": 1.2e-4, "min_lr": 1.2e-5, "warmup_iters": 2000, **_ADAM_GPT3},
        "layout": {"tp": 2, "pp": 1, "sequence_parallel": True, "distributed_optimizer": True},
        "precision": "bf16",
    },
    # 13.6B parameters as in the published ZeRO-1 case (DP 80, PP 2 on 40 GB A100s):
    # 40 layers, hidden 5120, 40 heads, a 200k multilingual vocabulary (tied embeddings).
    "gpt_13b6": {
        "model": {
            "num_layers": 40,
            "hidden_size": 5120,
            "num_attention_heads": 40,
            "seq_length": 2048,
            "vocab_size": 200704,
            "position_embedding": "rope",
            "flash_attention": True,
        },
        "batch": {"micro": 1, "global": 480},
        "optim": {"lr": 1.0e-4, "min_lr": 1.0e-5, "warmup_iters": 2000, **_ADAM_GPT3},
        "layout": {"tp": 1, "pp": 2, "distributed_optimizer": True, "recompute": "full"},
        "precision": "bf16",
    },
}


# Values an experiment gets when neither it nor its preset sets them.
DEFAULTS: dict[str, Any] = {
    "model": {
        "ffn_hidden_size": None,  # 4 x hidden_size
        "vocab_size": None,  # the tokenizer's, padded to a multiple of 128
        "position_embedding": "rope",
        "flash_attention": True,
    },
    "batch": {"micro": 1, "global": 8},
    "optim": {
        "lr": 3.0e-4,
        "min_lr": 3.0e-5,
        "warmup_iters": 0,
        "beta1": 0.9,
        "beta2": 0.95,
        "weight_decay": 0.1,
        "clip_grad": 1.0,
    },
    "layout": {
        "tp": 1,
        "pp": 1,
        "sequence_parallel": False,
        "distributed_optimizer": False,
        "recompute": "none",
    },
    "precision": "bf16",
}


class PresetError(ValueError):
    """A preset that does not exist."""


def _merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def resolve_experiment(name: str, experiment: dict[str, Any]) -> dict[str, Any]:
    """The experiment with its preset's values filled in where it sets none."""
    preset = experiment.get("preset")
    if preset is None:
        return _merge(DEFAULTS, experiment)
    if preset not in PRESETS:
        raise PresetError(
            f"training.experiments.{name}.preset: '{preset}' does not exist; "
            f"choose one of {', '.join(PRESETS)}"
        )
    return _merge(_merge(DEFAULTS, PRESETS[preset]), experiment)
