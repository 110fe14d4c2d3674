# What a plan costs: the node-hours and GPU-hours of the jobs that hold GPU nodes, printed
# with every plan of a GPU cluster and guarded by max_gpu_hours.


def rule_runtime_min(name, own=None):
    """A rule's time limit in minutes: the profile's set-resources, else the rule's own
    (``own``: what its callable gives), else the profile's default-resources."""
    value = _profile_resources.get(name, {}).get("runtime")
    if value is None:
        value = own
    if value is None:
        res = workflow.get_rule(name).resources.get("runtime")
        evaluable = callable(res) or getattr(res, "is_evaluable", lambda: False)()
        value = None if evaluable else getattr(res, "raw", res)
    if value is None:
        value = _profile_resources.get("default-resources", {}).get("runtime", 0)
    return runtime_minutes(value)


def trained_experiments(training):
    """The experiments whose segment records are among the targets ``training``."""
    return sorted(
        os.path.basename(os.path.dirname(t)) for t in training if t.endswith(".json")
    )


def planned_cpu_jobs(training, vision):
    """The CPU jobs still to run, where each holds a whole GPU node (a GPU site without a
    CPU partition): priced like GPU jobs. Shards tokenized in batches (one job per
    text.tokenize.shards_per_job shards) hold one node per batch still to run, for the
    batch's time limit where its inputs exist (else the tokenize rule's)."""
    jobs = []
    per_job = shards_per_job()
    for tok in TOKENIZE["tokenizers"]:
        cfg = TOKENIZERS[tok]
        if cfg["type"] == "train" and not os.path.exists(
            f"data/tokenizers/{tok}/tokenizer.json"
        ):
            jobs.append(
                PlanJob("train_tokenizer", 1, rule_runtime_min("train_tokenizer"))
            )
        for source in SOURCES:
            if os.path.exists(f"data/tokenized/{tok}/{source}_text_document.idx"):
                continue
            jobs.append(
                PlanJob("merge_tokenized", 1, rule_runtime_min("merge_tokenized"))
            )
            if per_job == 1:
                jobs += [
                    PlanJob("tokenize", 1, rule_runtime_min("tokenize"))
                    for shard in shard_ids(source)
                    if not os.path.exists(
                        f"data/tokenized/{tok}/{source}/{shard}_text_document.idx"
                    )
                ]
                continue
            for batch in batch_ids(source):
                if os.path.exists(f"data/tokenized/{tok}/{source}/batch{batch}.json"):
                    continue
                w = SimpleNamespace(source=source, batch=batch)
                inputs = batch_inputs(w)
                if all(os.path.exists(f) for f in inputs):
                    threads = batch_threads(w)
                    minutes = batch_runtime(w, SimpleNamespace(shards=inputs), threads)
                else:
                    minutes = rule_runtime_min("tokenize")
                jobs.append(PlanJob("tokenize_batch", 1, minutes))
    for target in vision:
        if not os.path.exists(target):
            jobs.append(PlanJob("pack_lmdb", 1, rule_runtime_min("pack_lmdb")))
    for name in trained_experiments(training):
        if not os.path.exists(f"data/index_cache/{name}.json"):
            jobs.append(
                PlanJob("prepare_data_cache", 1, rule_runtime_min("prepare_data_cache"))
            )
    if CLUSTER.container_build.on_compute_node:
        for image in {*container_image("train"), *container_image("vision")}:
            if not os.path.exists(image):
                jobs.append(
                    PlanJob("build_container", 1, rule_runtime_min("build_container"))
                )
    return jobs


def training_estimates(training):
    """Per experiment: the time to train from its tokens, at the rate measured by the
    user's own benchmark runs (results/bench/summary.csv) or the cluster's assumed one.
    """
    estimates = []
    for name in trained_experiments(training):
        prepared, job = EXPERIMENTS[name], SEGMENT_JOBS[name]
        if job.work is None:
            continue
        exp = prepared.experiment
        precision = exp.get("precision", "bf16")
        measured = measured_tflops(
            "results/bench/summary.csv", CLUSTER.name, exp.get("preset"), precision
        )
        assumed = (
            f"assumed: {CLUSTER.path} gpu.assumed_tflops"
            if CLUSTER.gpu.assumed_tflops
            else f"assumed: 40% of the peak, {CLUSTER.path} has no gpu.assumed_tflops"
        )
        rate, source = measured or (job.work.tflops_per_gpu, assumed)
        segments, nodes = exp["segments"], exp["layout"]["nodes"]
        estimates.append(
            TrainingEstimate(
                experiment=name,
                tokens=segments
                * exp["iterations_per_segment"]
                * prepared.layout.global_batch
                * exp["model"]["seq_length"],
                flops=segments * job.work.flops,
                gpus=job.work.gpus,
                tflops_per_gpu=rate,
                source=source,
                limit_gpu_hours=segments
                * nodes
                * CLUSTER.gpus_per_node
                * rule_runtime_min("train_segment", job.limit_minutes)
                / 60,
            )
        )
    return estimates


def check_plan_cost(training, vision=()):
    """Print the cost of the default target's jobs that hold GPU nodes and the time to
    train; stop a real run over the limit (a dry run or a look-only command such as
    --dag, --summary, --report only warns)."""
    jobs = []
    for target in training:
        if not target.endswith(".json"):  # the loss curve: a local job
            continue
        name = target.split("/")[2]
        runtime = rule_runtime_min("train_segment", SEGMENT_JOBS[name].limit_minutes)
        for k in range(1, EXPERIMENTS[name].experiment["segments"] + 1):
            if not os.path.exists(f"results/train/{name}/seg{k}.json"):
                nodes = EXPERIMENTS[name].experiment["layout"]["nodes"]
                jobs.append(PlanJob("train_segment", nodes, runtime))
    for record in bench_records():
        if not os.path.exists(record):
            point = BENCH_POINTS[record.split("/")[3]]
            name = f"bench_{point['benchmark']}"
            own = bench_runtime_min(point) if name == "bench_language" else None
            jobs.append(PlanJob(name, point["nodes"], rule_runtime_min(name, own)))
    for name in trained_experiments(training):
        for warning in SEGMENT_JOBS[name].warnings:
            logger.warning(f"Warning: {warning}")
    if CLUSTER.whole_nodes:
        jobs += planned_cpu_jobs(training, vision)
    costs = cost_per_rule(jobs, CLUSTER.gpus_per_node)
    for line in describe_cost(costs, CLUSTER.name):
        logger.info(line)
    for line in describe_training(training_estimates(training), CLUSTER.name):
        logger.info(line)
    problem = over_limit(costs, config[MAX_GPU_HOURS_KEY], CLUSTER.name)
    # Only a run that executes jobs is stopped: Snakemake has no executor for the
    # look-only commands (--dag, --rulegraph, --filegraph, --summary, --report, ...).
    executes = (
        workflow.executor_plugin is not None
        and not workflow.dryrun
        and not workflow.touch
    )
    if problem and executes:
        raise _WorkflowError(f"Nothing was submitted: {problem}")
    elif problem:
        logger.warning(f"Warning: {problem}")
