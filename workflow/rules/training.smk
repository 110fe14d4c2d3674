# Staged training: per experiment a chain of segments, k needing k-1 (see docs/training.md).
# Every experiment is planned here, at plan time (dry run included): a layout that cannot
# run or fit, an unknown preset or data source stops the workflow before any job.


include: "training_functions.smk"


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
        runtime=index_cache_runtime,
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
        # The training canary's record on GPU clusters (preflight.smk): none starts
        # before it passed.
        preflight=train_preflight,
        # layout: auto: the measuring job's choice (measure_layout)
        layout=layout_record,
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
    # attempt itself refuses to train after a deterministic failure, or after an attempt
    # that ran until its time limit without progress (one cut short from outside retries).
    # Only the controller retries: inside a Slurm job a retry would run in the same
    # allocation, whose time is up.
    # In a chain the chain's jobs make the attempts (hpcllm.training.campaign.chain).
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
        # Minutes: sized from the segment's work (hpcllm.training.plan.job_plan), or the
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


rule measure_layout:
    # layout: auto: the best predicted layouts, a few iterations each at full size, in one
    # job on the experiment's GPUs (one node where they fit there); the segments train
    # with the fastest (hpcllm.training.campaign.measure_layout, docs/training.md).
    input:
        data=training_data,
        tokenizer=training_tokenizer,
        container=training_container,
        preflight=train_preflight,
    output:
        record="results/layout/{experiment}.json",
    log:
        "logs/measure_layout/{experiment}.log",
    benchmark:
        "results/timings/measure_layout/{experiment}.tsv"
    wildcard_constraints:
        experiment="|".join(AUTO_EXPERIMENTS) or "NONE",
    conda:
        "../../envs/workflow.yaml"
    threads: 1
    resources:
        **MEASURE_RESOURCES,
        nodes=measure_nodes,
        tasks=measure_nodes,
        tasks_per_gpu=0,
        mpi="",
        runtime=measure_runtime,
        slurm_extra=measure_slurm_extra,
    params:
        prepared=prepared_experiment,
        cluster=CLUSTER,
        # Recorded by Snakemake: other candidates measure again.
        candidates=measure_key,
        # each candidate's launch script and engine log
        work="logs/measure_layout/{experiment}",
    script:
        "../scripts/measure_layout.py"


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
