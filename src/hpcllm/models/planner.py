"""Pre-flight planning of a training run: parallel layout and memory per GPU.

Run at plan time (``snakemake -n`` included), so that a layout that cannot work or cannot
fit is refused before anything is queued, with the estimate and a suggestion.

Memory model (bytes per GPU, for the pipeline stage that holds the most):

- weights, gradients and optimizer states: what Megatron-LM allocates, in the bytes per
  parameter of its distributed-optimizer guide at the pin
  (docs/user-guide/features/dist_optimizer.md: "fp16 parameters, fp16 gradients: 20 /
  4 + 16/d; bf16 parameters, fp32 gradients: 18 / 6 + 12/d; fp32 parameters, fp32
  gradients: 16 / 8 + 8/d", non-distributed / distributed optimizer, d = DP). bf16
  training accumulates and reduces gradients in fp32 (megatron/training/arguments.py sets
  ``accumulate_allreduce_grads_in_fp32`` for --bf16), so its gradient buffer is 4 bytes
  per parameter, not 2; the optimizer keeps fp32 main parameters and Adam's two moments
  (12 bytes; 16 in fp16, where fp32 main gradients are made from the fp16 ones), divided
  by DP with the distributed optimizer (ZeRO-1). The ZeRO paper's 2 + 2 + 12 (Rajbhandari
  et al. 2020) leaves out the fp32 copy of the gradients that Megatron makes.
- activations (Korthikanti et al. 2022, "Reducing activation recomputation"):
  ``s*b*h*(34 + 5*a*s/h)`` bytes per layer, divided by TP with sequence parallelism (the
  34 part only without it); flash attention drops the ``5*a*s/h`` term (no score matrix),
  selective recomputation drops it too, full recomputation keeps only ``2*s*b*h`` per
  layer. With 1F1B pipelining the first stage keeps ``min(PP, microbatches)``
  microbatches in flight. The fp32 logits (``4*s*b*V/TP``) are added for the last stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GB = 1e9


class PlanError(ValueError):
    """A training layout that cannot run or cannot fit; the message says what to change."""


def pad_vocab(vocab_size: int, tp: int, multiple: int = 128) -> int:
    """Megatron's ``--make-vocab-size-divisible-by`` padding (times TP)."""
    step = multiple * tp
    return int(math.ceil(vocab_size / step) * step)


@dataclass(frozen=True)
class Layout:
    gpus: int
    tp: int
    pp: int
    dp: int
    micro_batch: int
    global_batch: int

    @property
    def microbatches(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)


@dataclass(frozen=True)
class Memory:
    """Estimated memory per GPU in GB, by kind."""

    parameters: float  # billions, whole model
    weights: float
    gradients: float
    optimizer: float
    activations: float

    @property
    def states(self) -> float:
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        return self.states + self.activations

    def describe(self) -> str:
        return (
            f"{self.total:.1f} GB per GPU (weights {self.weights:.1f}, gradients "
            f"{self.gradients:.1f}, optimizer {self.optimizer:.1f}, activations "
            f"{self.activations:.1f}; {self.parameters:.2f}B parameters)"
        )


def count_parameters(model: dict[str, Any], vocab_size: int) -> tuple[int, int]:
    """(parameters in the transformer layers, parameters in embeddings and output)."""
    h = model["hidden_size"]
    f = model.get("ffn_hidden_size") or 4 * h
    per_layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h  # attention, MLP, 2 norms
    layers = model["num_layers"] * per_layer + 2 * h  # + final norm
    embedding = vocab_size * h
    if model.get("position_embedding", "rope") == "learned_absolute":
        embedding += model["seq_length"] * h
    return layers, embedding


def check_layout(
    name: str, experiment: dict[str, Any], gpus: int, procs_per_node: int | None = None
) -> Layout:
    """Divisibility rules of Megatron-LM; errors name the key to change."""
    model, lay, batch = experiment["model"], experiment["layout"], experiment["batch"]
    tp, pp = lay["tp"], lay["pp"]
    where = f"training.experiments.{name}"
    if gpus % (tp * pp):
        raise PlanError(
            f"{where}.layout: {gpus} GPUs (nodes x procs_per_node) are not divisible by "
            f"TP x PP = {tp} x {pp}; GPUs must equal DP x TP x PP. Change nodes, "
            "procs_per_node, tp or pp."
        )
    if procs_per_node and tp > procs_per_node:
        raise PlanError(
            f"{where}.layout: TP={tp} spans more than one node ({procs_per_node} GPUs per "
            "node); keep tensor parallelism inside a node (lower tp, raise pp)."
        )
    dp = gpus // (tp * pp)
    if model["num_layers"] % pp:
        raise PlanError(
            f"{where}: {model['num_layers']} layers are not divisible by PP={pp}; "
            "choose a pp that divides num_layers."
        )
    if model["num_attention_heads"] % tp:
        raise PlanError(
            f"{where}: {model['num_attention_heads']} attention heads are not divisible by "
            f"TP={tp}; choose a tp that divides num_attention_heads."
        )
    if model["hidden_size"] % model["num_attention_heads"]:
        raise PlanError(
            f"{where}.model: hidden_size {model['hidden_size']} is not divisible by "
            f"num_attention_heads {model['num_attention_heads']}."
        )
    if lay.get("sequence_parallel") and tp == 1:
        raise PlanError(
            f"{where}.layout: sequence_parallel needs TP > 1 (it splits the sequence "
            "across the tensor-parallel group); set tp > 1 or sequence_parallel: false."
        )
    micro, glob = batch["micro"], batch["global"]
    if glob % (micro * dp):
        raise PlanError(
            f"{where}.batch: global batch {glob} is not divisible by micro batch x DP = "
            f"{micro} x {dp} = {micro * dp}; choose a global batch that is a multiple of it."
        )
    return Layout(gpus, tp, pp, dp, micro, glob)


# (weights, gradients, optimizer states) bytes per parameter that Megatron-LM allocates,
# by precision: the table of Megatron-LM's dist_optimizer.md (see the module's
# docstring); the optimizer's share is divided by DP with the distributed optimizer.
STATE_BYTES = {"bf16": (2, 4, 12), "fp16": (2, 2, 16), "fp32": (4, 4, 8)}


def estimate_memory(experiment: dict[str, Any], layout: Layout, vocab_size: int) -> Memory:
    model, lay = experiment["model"], experiment["layout"]
    weight_bytes, grad_bytes, optim_bytes = STATE_BYTES[experiment.get("precision", "bf16")]
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    padded = pad_vocab(vocab_size, tp)
    layer_params, embed_params = count_parameters(model, padded)
    # The first stage holds its layers and the embedding (the last one the output layer,
    # tied to it: the same size), so it is the fullest.
    stage_params = (layer_params / pp + embed_params) / tp
    weights = stage_params * weight_bytes
    grads = stage_params * grad_bytes
    optim = stage_params * optim_bytes / (dp if lay.get("distributed_optimizer") else 1)

    s, b, h = model["seq_length"], layout.micro_batch, model["hidden_size"]
    a = model["num_attention_heads"]
    recompute = lay.get("recompute", "none")
    sp = lay.get("sequence_parallel", False)
    if recompute == "full":
        per_layer = 2 * s * b * h / (tp if sp else 1)
    else:
        linear = 34 * s * b * h
        scores = (
            0 if (model.get("flash_attention") or recompute == "selective") else 5 * a * s * s * b
        )
        per_layer = (
            (linear + scores) / tp if sp else 10 * s * b * h + (24 * s * b * h + scores) / tp
        )
    in_flight = min(pp, layout.microbatches) if pp > 1 else 1
    activations = per_layer * (model["num_layers"] / pp) * in_flight
    activations += 4 * s * b * padded / tp  # fp32 logits (last stage; counted once)
    return Memory(
        parameters=(layer_params + embed_params) / 1e9,
        weights=weights / GB,
        gradients=grads / GB,
        optimizer=optim / GB,
        activations=activations / GB,
    )


def _suggestion(experiment: dict[str, Any], layout: Layout, vocab: int, gpu_gb: float) -> str:
    """The smallest change among raising PP, TP, recomputation, the distributed optimizer."""
    model, lay = experiment["model"], experiment["layout"]
    for pp in range(layout.pp + 1, model["num_layers"] + 1):
        if model["num_layers"] % pp or layout.gpus % (layout.tp * pp):
            continue
        dp = layout.gpus // (layout.tp * pp)
        if layout.global_batch % (layout.micro_batch * dp):
            continue
        trial = Layout(layout.gpus, layout.tp, pp, dp, layout.micro_batch, layout.global_batch)
        mem = estimate_memory(experiment, trial, vocab)
        if mem.total <= gpu_gb:
            return f"raise pp to {pp} (estimate then {mem.describe()})"
    changes = []
    # (not where Megatron has no fused Adam to resume it with: megatron_args.as_run)
    if not lay.get("distributed_optimizer") and lay.get("fused_adam", True):
        changes.append("distributed_optimizer: true")
    if lay.get("recompute", "none") != "full":
        changes.append("recompute: full")
    if layout.micro_batch > 1:
        changes.append("a smaller micro batch")
    changes.append("a larger tp or more GPUs")
    return "try " + ", ".join(changes)


def plan(
    name: str,
    experiment: dict[str, Any],
    gpus: int,
    vocab_size: int,
    gpu_memory_gb: float | None,
    procs_per_node: int | None = None,
    headroom: float = 0.9,
) -> tuple[Layout, Memory]:
    """Check the layout and, where the GPU's memory is known, that it fits.

    ``headroom`` leaves part of the memory to the CUDA context, NCCL buffers and the
    allocator's fragmentation.
    """
    layout = check_layout(name, experiment, gpus, procs_per_node)
    memory = estimate_memory(experiment, layout, vocab_size)
    if gpu_memory_gb is not None and memory.total > headroom * gpu_memory_gb:
        raise PlanError(
            f"training.experiments.{name}: TP={layout.tp} PP={layout.pp} DP={layout.dp} "
            f"needs about {memory.describe()}, more than {headroom:.0%} of the GPU's "
            f"{gpu_memory_gb:g} GB. "
            + _suggestion(experiment, layout, vocab_size, headroom * gpu_memory_gb)
            + "."
        )
    return layout, memory
