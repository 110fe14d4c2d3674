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
from hpcllm.training.job_plan import segment_job

# Each experiment's segment job on this cluster: its time limit (sized from its work) and
# what cannot run here (refused here) or would waste GPU-hours (warned about with the
# cost lines, for the experiments the plan runs).
SEGMENT_JOBS = {}
for _name, _prepared in EXPERIMENTS.items():
    _tok = TEXT["tokenizers"][_prepared.experiment["data"]["tokenizer"]]
    _vocab = (
        _prepared.experiment["model"].get("vocab_size")
        or _tok.get("vocab_size")
        or 50257
    )
    try:
        SEGMENT_JOBS[_name] = segment_job(_name, _prepared, CLUSTER, _vocab, _tok)
    except ValueError as e:
        raise _WorkflowError(str(e))
from hpcllm.training.segment import hub_tokenizer_warning

for _name, _prepared in EXPERIMENTS.items():
    _warning = hub_tokenizer_warning(
        _name,
        _prepared.experiment["engine"],
        TEXT["tokenizers"][_prepared.experiment["data"]["tokenizer"]],
        _prepared.tokenizer_files,
        _prepared.eod_token,
    )
    if _warning:
        logger.warning(f"Warning: {_warning}")
from hpcllm.training.megatron_args import transformer_impl_for
from hpcllm.training.settings import plan_warning, weight_settings as _weight_settings

for _name, _prepared in EXPERIMENTS.items():
    # Settings that differ from what the checkpoints were trained with: the reason the
    # segments are planned again, and why they will refuse.
    _warning = plan_warning(
        _name,
        f"checkpoints/{_name}",
        _weight_settings(_prepared, transformer_impl_for(CLUSTER)),
    )
    if _warning:
        logger.warning(f"Warning: {_warning}")
from hpcllm.training.megatron_args import container_commit_mismatch

if any(p.experiment["engine"] == "megatron" for p in EXPERIMENTS.values()):
    for _image in container_image("train", check=False):
        _definition = config["containers"]["images"][
            os.path.basename(_image)[: -len(".sif")]
        ]
        if not os.path.exists(_definition):
            _definition = os.path.join(workflow.basedir, _definition)
        _mismatch = container_commit_mismatch(open(_definition).read(), _definition)
        if _mismatch:
            logger.warning(f"Warning: {_mismatch}")
for _name in TRAINING.get("run") or []:
    if _name not in EXPERIMENTS:
        raise _WorkflowError(
            f"training.run names '{_name}', which is not in training.experiments "
            f"({', '.join(EXPERIMENTS) or 'none defined'})"
        )

# training.chain on a Slurm run: train_segment runs on the login node, submits the
# experiment's self-continuing chain of Slurm jobs (or reattaches to it) and waits for its
# segment (hpcllm.training.chain; docs/training.md). Elsewhere it trains in place.
CHAINED = (
    bool(TRAINING["chain"])
    and CLUSTER.uses_slurm
    and (
        getattr(workflow.executor_plugin, "name", None)
        not in ("local", "slurm-jobstep")
    )
)
# Only the controller retries (in a Slurm job a retry would run in the same allocation,
# whose time is up); in a chain the chain's jobs make the attempts.
SEGMENT_RETRIES = (
    TRAINING["max_attempts"] - 1 if workflow.is_main_process and not CHAINED else 0
)
if CHAINED:
    import json as _json

    _settings = getattr(workflow, "executor_settings", None)
    # What the plugin adds to a job's sbatch line from its own settings; for the script.
    # (set for the script, which runs as a child of this process; not read here)
    os.environ.update(
        HPCLLM_CHAIN_SLURM_SETTINGS=_json.dumps(
            {
                key: getattr(_settings, key, None)
                for key in ("requeue", "no_requeue", "qos", "reservation")
            }
        )
    )


rule prepare_data_cache:
    # Megatron Core's dataset index cache, on a CPU job: the GPU jobs only load it.
    input:
        data=training_data,
        tokenizer=training_tokenizer,
    output:
        manifest="data/index_cache/{experiment}.json",
    log:
        "logs/prepare_data_cache/{experiment}.log",
    benchmark:
        "results/timings/prepare_data_cache/{experiment}.tsv"
    wildcard_constraints:
        experiment="|".join(EXPERIMENTS) or "NONE",
    conda:
        "../../envs/workflow.yaml"
    threads: 1
    resources:
        runtime=120,
        mem_mb=8000,
    params:
        prepared=prepared_experiment,
        folder=index_cache_dir,
        # Recorded by Snakemake: a change replans the cache (and the segments after it).
        settings=data_settings,
    script:
        "../scripts/prepare_data_cache.py"


rule train_segment:
    input:
        previous=previous_segment,
        data=training_data,
        tokenizer=training_tokenizer,
        container=training_container,
        index_cache="data/index_cache/{experiment}.json",
    output:
        record="results/train/{experiment}/seg{k}.json",
    log:
        main="logs/train_segment/{experiment}/seg{k}.log",
    benchmark:
        "results/timings/train_segment/{experiment}/seg{k}.tsv"
    wildcard_constraints:
        experiment="|".join(EXPERIMENTS) or "NONE",
        k=r"[1-9]\d*",
    # A segment that stopped for a transient reason (time limit, node failure,
    # preemption, a signal) is resubmitted and resumes from the newest checkpoint; the
    # attempt itself refuses to train after a deterministic failure or no progress.
    # Only the controller retries: inside a Slurm job a retry would run in the same
    # allocation, whose time is up.
    # In a chain the chain's jobs make the attempts (hpcllm.training.chain).
    retries: SEGMENT_RETRIES
    localrule: CHAINED
    conda:
        "../../envs/workflow.yaml"
    threads: 1
    resources:
        # Snakemake's attempt, for the script (a retry checks the previous attempt).
        attempt=segment_attempt,
        nodes=segment_nodes,
        # One task per node: --ntasks on CPU clusters; on GPU clusters the plugin would
        # turn `tasks` into --ntasks-per-gpu, which tasks_per_gpu=0 switches off.
        tasks=segment_nodes,
        tasks_per_gpu=0,
        # The key `mpi` makes the job step run the script in the batch shell (not in an
        # `srun -n1` step), so that the script's own srun gets the whole allocation; its
        # empty value keeps the plugin's MPI task checks (tasks > 1) off single-node jobs.
        mpi="",
        # Minutes: sized from the segment's work (hpcllm.training.job_plan), or the
        # experiment's time.limit_minutes.
        runtime=segment_runtime,
        mem_mb=4000,
        slurm_extra=segment_slurm_extra,
    params:
        prepared=prepared_experiment,
        cluster=CLUSTER,
        # Recorded by Snakemake: changing one replans the experiment's segments, whose
        # first refuses a checkpoint trained with other settings (docs/training.md).
        settings=weight_settings,
        save="checkpoints/{experiment}",
        index_cache=index_cache_dir,
        # Not a `log:` (Snakemake deletes those before every attempt): the engine's
        # output of every attempt, appended, for the loss curve and `hpcllm status`.
        engine_log="logs/train_segment/{experiment}/seg{k}.engine.log",
    script:
        "../scripts/train_segment_chain.py"
        if CHAINED
        else "../scripts/train_segment.py"


rule plot_training:
    # Loss against tokens (train and validation) from the segments' engine logs.
    input:
        records=all_segment_records,
    output:
        report(
            "results/train/{experiment}/loss.png",
            caption="../report/training_loss.rst",
            category="Training",
        ),
    log:
        "logs/plot_training/{experiment}.log",
    wildcard_constraints:
        experiment="|".join(EXPERIMENTS) or "NONE",
    localrule: True
    conda:
        "../../envs/workflow.yaml"
    params:
        engine_logs=segment_engine_logs,
        seq_length=experiment_seq_length,
    script:
        "../scripts/plot_training.py"
