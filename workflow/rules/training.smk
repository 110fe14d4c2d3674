# Staged training: per experiment a chain of segments, k needing k-1 (see docs/training.md).
# Every experiment is planned here, at plan time (dry run included): a layout that cannot
# run or fit, an unknown preset or data source stops the workflow before any job.
from hpcllm.training.segment import prepare_experiment

TRAINING = config["training"]
EXPERIMENTS = {}
for _name, _raw in TRAINING["experiments"].items():
    try:
        EXPERIMENTS[_name] = prepare_experiment(_name, _raw, TEXT, CLUSTER)
    except ValueError as e:
        raise _WorkflowError(str(e))
from hpcllm.training.megatron_args import container_commit_mismatch

if any(p.experiment["engine"] == "megatron" for p in EXPERIMENTS.values()):
    for _image in container_image("train"):
        _def = config["containers"]["images"][os.path.basename(_image)[: -len(".sif")]]
        _def = _def if os.path.exists(_def) else os.path.join(workflow.basedir, _def)
        _mismatch = container_commit_mismatch(open(_def).read(), _def)
        if _mismatch:
            logger.warning(f"Warning: {_mismatch}")
for _name in TRAINING.get("run") or []:
    if _name not in EXPERIMENTS:
        raise _WorkflowError(
            f"training.run names '{_name}', which is not in training.experiments "
            f"({', '.join(EXPERIMENTS) or 'none defined'})"
        )


def training_targets():
    names = TRAINING.get("run") or list(EXPERIMENTS)
    return [
        f"results/train/{name}/seg{EXPERIMENTS[name].experiment['segments']}.json"
        for name in names
    ]


def prepared_experiment(wildcards):
    return EXPERIMENTS[wildcards.experiment]


def previous_segment(wildcards):
    """Segment k-1's result record (none for the first segment)."""
    k = int(wildcards.k)
    if k > EXPERIMENTS[wildcards.experiment].experiment["segments"]:
        raise ValueError(f"{wildcards.experiment} has no segment {k}")
    return [] if k == 1 else [f"results/train/{wildcards.experiment}/seg{k - 1}.json"]


def training_data(wildcards):
    prefixes = EXPERIMENTS[wildcards.experiment].blend.prefixes
    return [p + ext for p in prefixes for ext in (".bin", ".idx")]


def training_tokenizer(wildcards):
    tok_dir = EXPERIMENTS[wildcards.experiment].tokenizer_dir
    return [f"{tok_dir}/vocab.json", f"{tok_dir}/merges.txt"]


def training_container(wildcards):
    """The training image on clusters with a container runtime, for either engine (the
    torch engine needs the GPU build of PyTorch there too); none where the runtime is none."""
    return container_image("train")


def segment_nodes(wildcards):
    return EXPERIMENTS[wildcards.experiment].experiment["layout"]["nodes"]


def segment_slurm_extra(wildcards):
    """Slurm signals the job steps (srun -> torchrun -> the engine) before the time limit."""
    seconds = EXPERIMENTS[wildcards.experiment].experiment["time"]["signal_seconds"]
    return f"--signal=TERM@{seconds}"


rule train_segment:
    input:
        previous=previous_segment,
        data=training_data,
        tokenizer=training_tokenizer,
        container=training_container,
    output:
        record="results/train/{experiment}/seg{k}.json",
    log:
        main="logs/train_segment/{experiment}/seg{k}.log",
        engine="logs/train_segment/{experiment}/seg{k}.engine.log",
    benchmark:
        "benchmarks/train_segment/{experiment}/seg{k}.tsv"
    wildcard_constraints:
        experiment="|".join(EXPERIMENTS) or "NONE",
        k=r"[1-9]\d*",
    threads: 1
    resources:
        nodes=segment_nodes,
        tasks=segment_nodes,
        mpi="srun",
        runtime=60,
        mem_mb=4000,
        slurm_extra=segment_slurm_extra,
    params:
        prepared=prepared_experiment,
        cluster=CLUSTER,
        save="checkpoints/{experiment}",
    script:
        "../scripts/train_segment.py"
