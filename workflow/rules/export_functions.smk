# The export stage's plan-time checks and input/params functions (its rules: export.smk,
# which includes this file first). Needs the training stage's EXPERIMENTS.
from hpcllm.training.plan.experiment import target_iteration as _target_iteration


def export_segments(name):
    """The segments whose checkpoints `export.segments` names (`last`: the last one)."""
    exp = EXPERIMENTS[name].experiment
    segments = exp["segments"]
    chosen = set()
    for k in (exp.get("export") or {}).get("segments", ["last"]):
        k = segments if k == "last" else k
        if not 1 <= k <= segments:
            raise _WorkflowError(
                f"training.experiments.{name}.export.segments: {k} is not one of its "
                f"segments 1..{segments}; name a segment number or `last`"
            )
        chosen.add(k)
    return sorted(chosen)


for _name in EXPERIMENTS:
    export_segments(_name)  # a wrong segment number stops the plan here


def export_targets(training):
    """The export records of the experiments whose training the default target runs
    (``training``: its training targets), one per segment `export.segments` names."""
    names = [
        name
        for name, prepared in EXPERIMENTS.items()
        if f"results/train/{name}/seg{prepared.experiment['segments']}.json" in training
    ]
    return [
        f"results/export/{name}/iter_{_target_iteration(EXPERIMENTS[name].experiment, k):07d}/export.json"
        for name in names
        for k in export_segments(name)
    ]


def export_segment_record(wildcards):
    """The record of the segment that ends at the iteration (any segment's end may be
    exported on request, e.g. by the evaluation stage)."""
    exp = EXPERIMENTS[wildcards.experiment].experiment
    ends = {_target_iteration(exp, k): k for k in range(1, exp["segments"] + 1)}
    it = int(wildcards.iteration)
    if it not in ends:
        raise ValueError(
            f"{wildcards.experiment}: no segment ends at iteration {it}; the checkpoints "
            f"that can be exported are those of iterations {', '.join(map(str, ends))}"
        )
    return f"results/train/{wildcards.experiment}/seg{ends[it]}.json"


def export_dtype(wildcards):
    exp = EXPERIMENTS[wildcards.experiment].experiment
    return (exp.get("export") or {}).get("dtype", "checkpoint")


def export_transformer_impl(wildcards):
    from hpcllm.models.megatron_args import transformer_impl_for

    return transformer_impl_for(CLUSTER)


def export_parameters(wildcards):
    model = EXPERIMENTS[wildcards.experiment].experiment["model"]
    h, layers = model["hidden_size"], model["num_layers"]
    ffn = model.get("ffn_hidden_size") or 4 * h
    vocab = model.get("vocab_size") or 50304
    return layers * (4 * h * h + 2 * h * ffn) + vocab * h


def export_mem_mb(wildcards):
    """Three copies of the model in fp32 (the checkpoint's tensors, the converted model,
    the files being written), at least 4 GB."""
    return max(4000, int(3 * 4 * export_parameters(wildcards) / 1e6))


def export_runtime(wildcards):
    """The export's time limit: sized from the model where the job holds a GPU node
    (hpcllm.cpu_limits), 120 minutes or more elsewhere."""
    from hpcllm.cpu_limits import cpu_job_minutes, export_minutes

    sized = export_minutes(export_parameters(wildcards))
    return cpu_job_minutes(120, sized, CLUSTER.whole_nodes, CLUSTER.max_minutes)
