"""Checkpoints of either engine as Hugging Face ``transformers`` models.

The torch engine's checkpoint holds a ``transformers`` model's own state dict (Llama or
GPT-2, see ``hpcllm.training.engines.torch_engine.build_model``): rebuilt with the engine's own
code, it is the model. Megatron-LM at the pin saves ``--ckpt-format torch_dist`` (its
default; the workflow passes no other): a PyTorch distributed checkpoint whose tensors are
stored whole (TP shards concatenated, each layer's tensors stacked over the layers of
every pipeline stage), read here with Megatron Core's own reader whatever the layout
that wrote it; a legacy ``--ckpt-format torch`` checkpoint (a state dict per TP and PP
rank) is merged here. Megatron's GPT model as the workflow generates it (LayerNorm, biases,
GELU in its tanh form: Megatron's fused bias-GELU and Transformer Engine's both use it,
one key/value group per head, tied embeddings) is GPT-2 with learned positions and
GPT-NeoX (sequential residual) with RoPE; the only re-layout is GPT-2's QKV, which
Megatron interleaves per head ``[q_h, k_h, v_h]`` and GPT-2 keeps as ``[q | k | v]``.

Megatron-Bridge (the published converter) needs Transformer Engine and mamba-ssm, which
do not install without CUDA, and maps Llama-style models, not these: hence this module.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

# Megatron's GELU (fused bias-GELU, Transformer Engine): 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))
MEGATRON_GELU = "gelu_pytorch_tanh"
LAYER_NORM_EPS = 1e-5  # Megatron-LM's --norm-epsilon default
ROPE_BASE = 10000.0  # --rotary-base default

# A layer's tensors by Megatron's name in a torch_dist checkpoint (Transformer Engine's
# names: Megatron's local layers map theirs to these when they save).
_LAYER = {
    "ln1.weight": "self_attention.linear_qkv.layer_norm_weight",
    "ln1.bias": "self_attention.linear_qkv.layer_norm_bias",
    "qkv.weight": "self_attention.linear_qkv.weight",
    "qkv.bias": "self_attention.linear_qkv.bias",
    "proj.weight": "self_attention.linear_proj.weight",
    "proj.bias": "self_attention.linear_proj.bias",
    "ln2.weight": "mlp.linear_fc1.layer_norm_weight",
    "ln2.bias": "mlp.linear_fc1.layer_norm_bias",
    "fc1.weight": "mlp.linear_fc1.weight",
    "fc1.bias": "mlp.linear_fc1.bias",
    "fc2.weight": "mlp.linear_fc2.weight",
    "fc2.bias": "mlp.linear_fc2.bias",
}


class ExportError(ValueError):
    """A checkpoint this module cannot turn into a Hugging Face model; says why."""


# ------------------------------------------------------------------ the torch engine


def torch_engine_model(model_file: str | Path):
    """The torch engine's model from its ``model_optim_rng.pt``, as it trained it."""
    import torch

    from hpcllm.models.planner import pad_vocab
    from hpcllm.training.engines.torch_engine import build_model

    state = torch.load(model_file, map_location="cpu", weights_only=False)
    args = argparse.Namespace(**state["args"])
    vocab = state["model"]["lm_head.weight"].shape[0]
    model = build_model(args, pad_vocab(vocab, 1, args.make_vocab_size_divisible_by))
    model.load_state_dict(state["model"])
    return model.eval()


# ------------------------------------------------------------------------ Megatron-LM


def megatron_tensors(folder: str | Path) -> dict[str, Any]:
    """The model's tensors of a Megatron-LM checkpoint folder (``iter_NNNNNNN``), whole,
    by the names of a torch_dist checkpoint; a layer's tensors stacked over the layers
    (first axis). torch_dist (the pin's default) or the legacy ``--ckpt-format torch``."""
    folder = Path(folder)
    if (folder / "metadata.json").exists():
        return _torch_dist_tensors(folder)
    if any(folder.glob("mp_rank_*")):
        return legacy_tensors(folder)
    raise ExportError(
        f"{folder}: neither a torch_dist checkpoint (metadata.json) nor a legacy one "
        "(mp_rank_* folders)"
    )


def _torch_dist_tensors(folder: Path) -> dict[str, Any]:
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor

    own_group = not dist.is_initialized()
    if own_group:  # the reader gathers over a process group: one of this process alone
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        meta = dist_checkpointing.load_tensors_metadata(str(folder))
        wanted = {
            k: v
            for k, v in meta.items()
            if isinstance(v, ShardedTensor) and not k.startswith(("optimizer.", "rng_state"))
        }
        loaded = dist_checkpointing.load(wanted, str(folder))
    finally:
        if own_group:
            dist.destroy_process_group()
    return {k: v for k, v in loaded.items() if k in wanted}


# Legacy checkpoints: one state dict per (TP, PP) rank, in mp_rank_TT[_PPP]. Column-
# parallel tensors are split over TP along their output axis (QKV by whole head groups,
# so the concatenation is the TP 1 layout), row-parallel ones along their input axis;
# the rest is replicated. Layer numbers count from 0 on each pipeline stage.
_COLUMN = ("linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight", "linear_fc1.bias",
           "word_embeddings.weight", "output_layer.weight")  # fmt: skip
_ROW = ("linear_proj.weight", "linear_fc2.weight")
_LOCAL_NAMES = {  # Megatron's local layers' norms -> their torch_dist (TE) names
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "input_layernorm.bias": "self_attention.linear_qkv.layer_norm_bias",
    "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
    "pre_mlp_layernorm.bias": "mlp.linear_fc1.layer_norm_bias",
}
_RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?$")


def legacy_tensors(folder: str | Path) -> dict[str, Any]:
    """A legacy ``--ckpt-format torch`` checkpoint's model, merged over TP and PP."""
    import torch

    shards: dict[tuple[int, int], dict[str, Any]] = {}
    for path in sorted(Path(folder).glob("mp_rank_*")):
        m = _RANK_DIR.match(path.name)
        if not m:
            continue
        state = torch.load(path / "model_optim_rng.pt", map_location="cpu", weights_only=False)
        if "model" not in state:
            raise ExportError(f"{path}/model_optim_rng.pt: has no model (virtual pipeline stages?)")
        shards[(int(m.group(1)), int(m.group(2) or 0))] = state["model"]
    tp = 1 + max(t for t, _ in shards)
    pp = 1 + max(p for _, p in shards)
    if len(shards) != tp * pp:
        raise ExportError(f"{folder}: {len(shards)} rank folders, not TP {tp} x PP {pp}")
    merged: dict[str, Any] = {}
    layers: dict[int, dict[str, Any]] = {}
    offset = 0
    for stage in range(pp):
        names = [k for k in shards[(0, stage)] if not k.endswith("_extra_state")]
        count = 0
        for name in names:
            parts = [shards[(t, stage)][name] for t in range(tp)]
            if name.endswith(_COLUMN):
                tensor = torch.cat(parts, dim=0)
            elif name.endswith(_ROW):
                tensor = torch.cat(parts, dim=1)
            else:
                tensor = parts[0]
            m = re.match(r"^decoder\.layers\.(\d+)\.(.+)$", name)
            if m:
                local, rest = int(m.group(1)), m.group(2)
                count = max(count, local + 1)
                layers.setdefault(offset + local, {})[_LOCAL_NAMES.get(rest, rest)] = tensor
            elif name == "output_layer.weight" and stage == pp - 1:
                merged.setdefault("output_layer.weight", tensor)
            else:
                merged[name] = tensor
        offset += count
    out = {k: v for k, v in merged.items() if k != "output_layer.weight"}
    output = merged.get("output_layer.weight")
    words = out.get("embedding.word_embeddings.weight")
    if output is not None and (words is None or not torch.equal(output, words)):
        raise ExportError(f"{folder}: the output layer is not tied to the word embeddings")
    for rest in layers[0]:
        out[f"decoder.layers.{rest}"] = torch.stack([layers[i][rest] for i in sorted(layers)])
    return out


def _layer_tensors(tensors: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    names = {v: k for k, v in _LAYER.items()}
    missing = [f"decoder.layers.{n}" for n in names if f"decoder.layers.{n}" not in tensors]
    if missing:
        raise ExportError(f"the checkpoint has no {', '.join(missing)}")
    count = tensors["decoder.layers.self_attention.linear_qkv.weight"].shape[0]
    layers = [{short: tensors[f"decoder.layers.{long}"][i] for short, long in _LAYER.items()}
              for i in range(count)]  # fmt: skip
    return count, layers


def check_megatron_names(tensors: dict[str, Any]) -> None:
    """Refuse tensors of a model this mapping does not describe (MoE, SwiGLU halves,
    QK norms, an untied output layer): exported, they would be silently dropped."""
    known = {f"decoder.layers.{n}" for n in _LAYER.values()} | {
        "embedding.word_embeddings.weight",
        "embedding.position_embeddings.weight",
        "decoder.final_layernorm.weight",
        "decoder.final_layernorm.bias",
    }
    unknown = sorted(k for k in tensors if k not in known and not k.endswith("_extra_state"))
    if unknown:
        raise ExportError(
            f"the checkpoint has tensors the export does not map: {', '.join(unknown)} "
            "(the workflow's GPT models have LayerNorm, biases, GELU and tied embeddings)"
        )


def megatron_to_hf(tensors: dict[str, Any], heads: int, position_embedding: str,
                   max_positions: int, eod_id: int | None = None):  # fmt: skip
    """A ``transformers`` model with the weights of Megatron's GPT model ``tensors``
    (from :func:`megatron_tensors`): GPT-2 for learned positions, GPT-NeoX for RoPE."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    check_megatron_names(tensors)
    count, layers = _layer_tensors(tensors)
    words = tensors["embedding.word_embeddings.weight"]
    vocab, hidden = words.shape
    ffn = layers[0]["fc1.weight"].shape[0]
    if layers[0]["qkv.weight"].shape[0] != 3 * hidden:
        raise ExportError(
            f"the QKV weight has {layers[0]['qkv.weight'].shape[0]} rows, not 3 x hidden "
            f"size {hidden}: grouped-query attention is not exported"
        )
    if hidden % heads:
        raise ExportError(f"hidden size {hidden} is not divisible by {heads} heads")
    common = dict(bos_token_id=eod_id, eos_token_id=eod_id, tie_word_embeddings=True)
    out: dict[str, Any] = {}
    if position_embedding == "rope":
        config = transformers.GPTNeoXConfig(
            vocab_size=vocab, hidden_size=hidden, num_hidden_layers=count,
            num_attention_heads=heads, intermediate_size=ffn, hidden_act=MEGATRON_GELU,
            max_position_embeddings=max_positions, layer_norm_eps=LAYER_NORM_EPS,
            use_parallel_residual=False, attention_bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": ROPE_BASE,
                             "partial_rotary_factor": 1.0},
            **common,
        )  # fmt: skip
        # The same for transformers 4 (rotary_pct defaulted to 0.25 there): a folder read
        # by an older release must not silently rotate a quarter of each head.
        config.rotary_pct, config.rotary_emb_base = 1.0, ROPE_BASE
        cls = transformers.GPTNeoXForCausalLM
        out["gpt_neox.embed_in.weight"] = words
        for i, t in enumerate(layers):
            p = f"gpt_neox.layers.{i}."
            # GPT-NeoX splits its fused QKV per head as [q_h, k_h, v_h], as Megatron does
            out.update({
                p + "input_layernorm.weight": t["ln1.weight"], p + "input_layernorm.bias": t["ln1.bias"],
                p + "attention.query_key_value.weight": t["qkv.weight"],
                p + "attention.query_key_value.bias": t["qkv.bias"],
                p + "attention.dense.weight": t["proj.weight"], p + "attention.dense.bias": t["proj.bias"],
                p + "post_attention_layernorm.weight": t["ln2.weight"],
                p + "post_attention_layernorm.bias": t["ln2.bias"],
                p + "mlp.dense_h_to_4h.weight": t["fc1.weight"], p + "mlp.dense_h_to_4h.bias": t["fc1.bias"],
                p + "mlp.dense_4h_to_h.weight": t["fc2.weight"], p + "mlp.dense_4h_to_h.bias": t["fc2.bias"],
            })  # fmt: skip
        out["gpt_neox.final_layer_norm.weight"] = tensors["decoder.final_layernorm.weight"]
        out["gpt_neox.final_layer_norm.bias"] = tensors["decoder.final_layernorm.bias"]
    elif position_embedding == "learned_absolute":
        positions = tensors.get("embedding.position_embeddings.weight")
        if positions is None:
            raise ExportError("learned positions, but the checkpoint has no position embeddings")
        config = transformers.GPT2Config(
            vocab_size=vocab, n_positions=positions.shape[0], n_embd=hidden, n_layer=count,
            n_head=heads, n_inner=ffn, activation_function=MEGATRON_GELU,
            layer_norm_epsilon=LAYER_NORM_EPS, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, **common,
        )  # fmt: skip
        cls = transformers.GPT2LMHeadModel
        out["transformer.wte.weight"] = words
        out["transformer.wpe.weight"] = positions
        head = hidden // heads
        for i, t in enumerate(layers):
            p = f"transformer.h.{i}."
            # Megatron: rows [q_0 k_0 v_0 q_1 k_1 v_1 ...]; GPT-2: [q_0 q_1 ... | k ... | v ...]
            qkv_w = t["qkv.weight"].reshape(heads, 3, head, hidden).transpose(0, 1)
            qkv_b = t["qkv.bias"].reshape(heads, 3, head).transpose(0, 1)
            # GPT-2's Conv1D weights are (in, out): Megatron's Linear ones transposed
            out.update({
                p + "ln_1.weight": t["ln1.weight"], p + "ln_1.bias": t["ln1.bias"],
                p + "attn.c_attn.weight": qkv_w.reshape(3 * hidden, hidden).T,
                p + "attn.c_attn.bias": qkv_b.reshape(3 * hidden),
                p + "attn.c_proj.weight": t["proj.weight"].T, p + "attn.c_proj.bias": t["proj.bias"],
                p + "ln_2.weight": t["ln2.weight"], p + "ln_2.bias": t["ln2.bias"],
                p + "mlp.c_fc.weight": t["fc1.weight"].T, p + "mlp.c_fc.bias": t["fc1.bias"],
                p + "mlp.c_proj.weight": t["fc2.weight"].T, p + "mlp.c_proj.bias": t["fc2.bias"],
            })  # fmt: skip
        out["transformer.ln_f.weight"] = tensors["decoder.final_layernorm.weight"]
        out["transformer.ln_f.bias"] = tensors["decoder.final_layernorm.bias"]
    else:
        raise ExportError(f"position embedding {position_embedding!r} is not exported")
    # from_pretrained with a state dict: no random initialisation, buffers (RoPE's
    # frequencies) made as a loaded model has them, the output layer tied to the input's
    model = cls.from_pretrained(
        None, config=config, state_dict={k: v.contiguous() for k, v in out.items()},
        dtype=words.dtype,
    )  # fmt: skip
    loaded = dict(model.named_parameters(remove_duplicate=False))
    unused, unset = sorted(set(out) - set(loaded)), sorted(set(loaded) - set(out))
    unset = [n for n in unset if n != "lm_head.weight"]  # tied: the input embedding
    if unused or unset:
        raise ExportError(
            f"mapping incomplete for {cls.__name__}: not in it {unused}, not set {unset}"
        )
    for name, tensor in out.items():  # every weight arrived (none left at its default)
        if not torch.equal(loaded[name].detach(), tensor):
            raise ExportError(f"{name}: not loaded into {cls.__name__}")
    return model.eval()
