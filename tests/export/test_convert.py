"""The Megatron mapping's refusals and dtype, on synthetic tensors (no Megatron run)."""

from __future__ import annotations

import pytest
import torch

from hpcllm.export.convert import _LAYER, ExportError, megatron_to_hf

LAYERS, HIDDEN, FFN, VOCAB = 2, 16, 64, 128


def tensors(dtype=torch.float32) -> dict:
    shapes = {
        "ln1.weight": (HIDDEN,), "ln1.bias": (HIDDEN,), "qkv.weight": (3 * HIDDEN, HIDDEN),
        "qkv.bias": (3 * HIDDEN,), "proj.weight": (HIDDEN, HIDDEN), "proj.bias": (HIDDEN,),
        "ln2.weight": (HIDDEN,), "ln2.bias": (HIDDEN,), "fc1.weight": (FFN, HIDDEN),
        "fc1.bias": (FFN,), "fc2.weight": (HIDDEN, FFN), "fc2.bias": (HIDDEN,),
    }  # fmt: skip
    out = {
        f"decoder.layers.{_LAYER[k]}": torch.randn(LAYERS, *s, dtype=dtype)
        for k, s in shapes.items()
    }
    out["embedding.word_embeddings.weight"] = torch.randn(VOCAB, HIDDEN, dtype=dtype)
    out["embedding.position_embeddings.weight"] = torch.randn(8, HIDDEN, dtype=dtype)
    out["decoder.final_layernorm.weight"] = torch.randn(HIDDEN, dtype=dtype)
    out["decoder.final_layernorm.bias"] = torch.randn(HIDDEN, dtype=dtype)
    return out


@pytest.mark.parametrize("position", ["rope", "learned_absolute"])
def test_bf16_checkpoints_stay_bf16(position):
    model = megatron_to_hf(tensors(torch.bfloat16), 4, position, 8)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_an_untied_output_layer_is_refused():
    with pytest.raises(ExportError, match="output_layer.weight"):
        megatron_to_hf(
            {**tensors(), "output_layer.weight": torch.randn(VOCAB, HIDDEN)}, 4, "rope", 8
        )


def test_grouped_query_attention_is_refused():
    t = tensors()
    t["decoder.layers.self_attention.linear_qkv.weight"] = torch.randn(LAYERS, 2 * HIDDEN, HIDDEN)
    with pytest.raises(ExportError, match="grouped-query attention"):
        megatron_to_hf(t, 4, "rope", 8)
