"""The pre-flight planner: layout rules, memory estimates, the published 13.6B case."""

from __future__ import annotations

import pytest

from hpcllm.models.planner import GB, PlanError, check_layout, estimate_memory, pad_vocab, plan
from hpcllm.models.presets import PRESETS, PresetError, resolve_experiment


def experiment(preset: str, **layout) -> dict:
    exp = resolve_experiment("x", {"preset": preset})
    exp["layout"].update(layout)
    return exp


def test_13b6_zero1_dp80_needs_56gb_and_pp2_on_40gb_a100():
    """Published: 13.6B with ZeRO-1 over DP=80 needs ~56 GB of parameters, gradients and
    optimizer states; PP=2 was required on 40 GB A100s (about 28 GB per GPU). That
    accounting has 2-byte gradients: Megatron-LM's fp16 row (4 + 16/d bytes)."""
    exp = experiment("gpt_13b6", pp=1)
    exp["precision"] = "fp16"
    layout = check_layout("x", exp, 80)
    assert layout.dp == 80
    mem = estimate_memory(exp, layout, 200704)
    assert mem.parameters == pytest.approx(13.6, rel=0.01)
    assert mem.states == pytest.approx(56, rel=0.03)
    with pytest.raises(PlanError, match=r"TP=1 PP=1 DP=80 needs about .* 40 GB\. raise pp to 2"):
        plan("x", exp, 80, 200704, 40)
    exp = experiment("gpt_13b6", pp=2)
    exp["precision"] = "fp16"
    layout, mem = plan("x", exp, 160, 200704, 40)
    assert layout.dp == 80
    assert 27 <= mem.states <= 31  # "about 28 GB"; the first stage also holds the embedding
    assert mem.total < 0.9 * 40


@pytest.mark.parametrize(
    ("precision", "distributed", "bytes_per_param"),
    [
        # Megatron-LM's docs/user-guide/features/dist_optimizer.md at the pin, d = DP = 8
        ("fp16", False, 20),
        ("bf16", False, 18),
        ("fp32", False, 16),
        ("fp16", True, 4 + 16 / 8),
        ("bf16", True, 6 + 12 / 8),
        ("fp32", True, 8 + 8 / 8),
    ],
)
def test_states_are_what_megatron_allocates(precision, distributed, bytes_per_param):
    exp = experiment("opengptx_800m", tp=1, sequence_parallel=False)
    exp["layout"]["distributed_optimizer"] = distributed
    exp["precision"] = precision
    mem = estimate_memory(exp, check_layout("x", exp, 8), 50257)
    assert mem.states == pytest.approx(mem.parameters * bytes_per_param)


def test_bf16_keeps_fp32_gradients_so_175b_does_not_fit_64_juwels_nodes():
    """GPT-3 175B on 64 JUWELS Booster nodes (TP 4, PP 32, DP 2; A100 40 GB): 2-byte
    gradients gave 35.8 GB (under 36, 90% of 40); Megatron's fp32 main gradients in bf16
    make it about 38.9 GB, which does not fit."""
    exp = experiment("gpt3_175b", tp=4, pp=32)
    layout = check_layout("x", exp, 256, procs_per_node=4)
    mem = estimate_memory(exp, layout, 50257)
    assert mem.gradients == pytest.approx(2 * mem.weights)
    assert mem.total == pytest.approx(38.9, abs=0.1)
    with pytest.raises(PlanError, match=r"needs about 38\.9 GB per GPU .* 40 GB"):
        plan("x", exp, 256, 50257, 40, procs_per_node=4)


def test_distributed_optimizer_recompute_and_flash_attention_lower_the_estimate():
    base = experiment("opengptx_800m", tp=1, sequence_parallel=False, distributed_optimizer=False)
    layout = check_layout("x", base, 8)
    plain = estimate_memory(base, layout, 50257)
    zero1 = estimate_memory(
        experiment("opengptx_800m", tp=1, sequence_parallel=False), layout, 50257
    )
    assert zero1.optimizer == pytest.approx(plain.optimizer / 8)
    assert zero1.weights == plain.weights
    full = experiment("opengptx_800m", tp=1, sequence_parallel=False, recompute="full")
    assert estimate_memory(full, layout, 50257).activations < plain.activations / 4
    no_flash = experiment("opengptx_800m", tp=1, sequence_parallel=False)
    no_flash["model"]["flash_attention"] = False
    assert estimate_memory(no_flash, layout, 50257).activations > 1.5 * plain.activations


@pytest.mark.parametrize(
    ("gpus", "change", "message"),
    [
        (12, {"tp": 8}, "not divisible by TP x PP"),
        (12, {"pp": 3}, "layers are not divisible by PP=3"),
        (16, {"tp": 16}, "spans more than one node"),
        (24, {"tp": 3}, "heads are not divisible by TP=3"),
        (8, {"tp": 1, "sequence_parallel": True}, "sequence_parallel needs TP > 1"),
    ],
)
def test_inconsistent_layouts_are_refused(gpus, change, message):
    exp = experiment("opengptx_800m", **change)
    exp["model"]["num_attention_heads"] = 16 if "heads" not in message else 8
    with pytest.raises(PlanError, match=message):
        check_layout("x", exp, gpus, procs_per_node=4 if "node" in message else None)


def test_vocabulary_padding_is_megatrons_times_tp():
    """Megatron pads to a multiple of make-vocab-size-divisible-by (128) x TP."""
    assert [pad_vocab(50257, tp) for tp in (1, 2, 4, 8)] == [50304, 50432, 50688, 51200]
    assert pad_vocab(50304, 1) == 50304


def test_tensor_parallelism_filling_exactly_one_node_is_accepted():
    exp = experiment("opengptx_800m", tp=4)
    exp["model"]["num_attention_heads"] = 16
    assert check_layout("x", exp, 8, procs_per_node=4).tp == 4


def test_pipeline_keeps_min_pp_microbatches_in_flight():
    """1F1B: the first stage holds min(PP, microbatches) microbatches' activations."""
    exp = experiment("opengptx_800m", tp=1, pp=4, sequence_parallel=False)
    s, b = exp["model"]["seq_length"], exp["batch"]["micro"]
    logits = 4 * s * b * pad_vocab(50257, 1) / GB

    def stored(global_batch):
        exp["batch"]["global"] = global_batch
        layout = check_layout("x", exp, 8)  # DP = 2
        return estimate_memory(exp, layout, 50257).activations - logits, layout.microbatches

    one, n1 = stored(2 * b)
    two, n2 = stored(4 * b)
    many, n8 = stored(16 * b)
    assert (n1, n2, n8) == (1, 2, 8)
    assert two == pytest.approx(2 * one) and many == pytest.approx(4 * one)


def test_global_batch_must_divide_by_micro_batch_times_dp():
    exp = experiment("opengptx_800m", tp=1, sequence_parallel=False)
    exp["batch"]["global"] = 500
    with pytest.raises(PlanError, match=r"global batch 500 is not divisible by .* 4 x 8 = 32"):
        check_layout("x", exp, 8)


def test_every_preset_plans_on_its_layout():
    gpus = {"tiny": 1, "gpt3_860m": 1, "gpt3_175b": 1024, "gpt_13b6": 160}
    for name in PRESETS:
        exp = experiment(name)
        layout, mem = plan(name, exp, gpus.get(name, 8), 50257, 80 if name != "tiny" else None)
        assert mem.total > 0 and layout.gpus == gpus.get(name, 8)


def test_175b_on_one_node_is_refused_with_a_suggestion():
    exp = experiment("gpt3_175b", tp=8, pp=1)
    exp["batch"]["global"] = 8
    with pytest.raises(PlanError, match="try|raise pp"):
        plan("x", exp, 8, 50257, 80)


def test_unknown_preset():
    with pytest.raises(PresetError, match="'gpt5' does not exist; choose one of tiny"):
        resolve_experiment("x", {"preset": "gpt5"})
