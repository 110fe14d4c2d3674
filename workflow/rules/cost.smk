# What a plan costs: the node-hours and GPU-hours of the jobs of the DAG that hold GPU
# nodes, printed with every plan of a GPU cluster and guarded by max_gpu_hours.
from snakemake.exceptions import WorkflowError


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


def training_estimates(names):
    """Per experiment: the time to train from its tokens, at the rate measured by the
    user's own benchmark runs (results/bench/summary.csv) or the cluster's assumed one.
    """
    estimates = []
    for name in names:
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
                * CLUSTER.billed_gpus_per_node
                * rule_runtime_min("train_segment", job.limit_minutes)
                / 60,
                billed_per_gpu=CLUSTER.billed_gpus_per_node / CLUSTER.gpus_per_node,
            )
        )
    return estimates


def training_calendar(names):
    """Per experiment the calendar's line (hpcllm.training.campaign.calendar): its own
    segments' records where any ran, else the plan's model rate (calendar.model_rate:
    layout: auto's table's predicted s/iteration, else the segment's FLOPs at the assumed
    or benchmarked rate) and the canary's start-up and save; no queue wait (nothing
    measured it yet, and a plan asks Slurm nothing)."""
    import time

    from hpcllm.training.campaign import calendar
    from hpcllm.training.campaign.status import vocab_size
    from hpcllm.training.checkpoints.tracker import CheckpointError, latest_iteration

    lines = []
    for name in names:
        exp = EXPERIMENTS[name].experiment
        model = calendar.model_rate(
            EXPERIMENTS[name], CLUSTER, vocab_size(EXPERIMENTS[name], TEXT)
        )
        try:
            iteration = latest_iteration(f"checkpoints/{name}") or 0
        except CheckpointError:
            iteration = 0
        records = calendar.read_records(
            [f"checkpoints/{name}/chain", f"results/train/{name}"], exp["segments"]
        )
        f = calendar.campaign_forecast(
            exp,
            records,
            iteration,
            time.time(),
            model_seconds=model[0] if model else None,
            model_source=model[1] if model else "the plan's model estimate",
            canary=calendar.canary_seconds(canary_record(f"train_{exp['engine']}")),
            layout=calendar.layout_measurement(name),
        )
        what = calendar.describe(f) if f else "expected to finish: not known yet"
        if f is None and not calendar.segments_left(exp, iteration):
            what = "trained"
        elif f is None:
            what += " (no segment measured, and no model rate on this cluster)"
        lines.append(f"  {name}: {what}")
    return ["When training will finish (hpcllm.training.campaign.calendar):"] + lines


def asks_for_gpus(job):
    res = job.resources
    return "gpu" in str(res.get("gres") or "") or bool(
        res.get("gpu") or res.get("gpus")
    )


def holds_gpu_nodes(job):
    """Whether a Slurm job of the plan holds GPU nodes: it asks for GPUs, or every job
    here gets whole GPU nodes (a GPU site without a CPU partition). Not job.is_local: a
    dry run executes locally, so to it every job is local. A chain's train_segment is a
    login-node rule whose segment runs in a chain job with the rule's resources
    (hpcllm.training.campaign.chain): priced as that job."""
    chain_job = job.rule.name == "train_segment" and CHAINED
    if (job.rule.name in workflow._localrules or job.rule.norun) and not chain_job:
        return False
    return CLUSTER.whole_nodes or asks_for_gpus(job)


def planned_job(job):
    """A job of the DAG as Slurm is asked for it: its nodes and time limit, the resources
    the executor submits. A job whose time limit needs inputs not made yet (a tokenize
    batch of a source still to fetch is sized from its bytes) is priced at its rule's
    fixed limit, for a tokenize batch that of one shard's tokenize job."""
    name = job.rule.name
    try:
        res = job.resources
        nodes, runtime = res.get("nodes"), res.get("runtime")
    except (WorkflowError, OSError, ValueError, TypeError):
        nodes, runtime = None, None
    # Snakemake's "<TBD>" for a resource it cannot size yet is no number of minutes
    unsized = rule_runtime_min("tokenize" if name == "tokenize_batch" else name)
    try:
        minutes = runtime_minutes(runtime) if runtime else unsized
    except ValueError:
        minutes = unsized
    try:
        nodes = int(nodes or 1)
    except ValueError:
        nodes = 1
    return PlanJob(name, nodes, minutes)


def hang_risks(dag):
    """Per GPU job type of the plan (a training segment per experiment), its largest job
    (nodes x time limit) and what a hang of it costs: until the segment watchdog's bound
    (hpcllm.training.campaign.watchdog, from the experiment's measured times), or until
    the time limit for jobs without a watchdog."""
    from hpcllm.training.campaign.watchdog import segment_bounds

    largest = {}
    for job in dag.needrun_jobs():
        if not (holds_gpu_nodes(job) and asks_for_gpus(job)):
            continue
        planned = planned_job(job)
        segment = planned.rule == "train_segment"
        key = (
            f"train_segment {job.wildcards['experiment']}" if segment else planned.rule
        )
        size = planned.nodes * planned.runtime_min
        if key not in largest or size > largest[key][2]:
            largest[key] = (job, planned, size)
    risks = []
    for key, (job, planned, _) in sorted(largest.items()):
        if not key.startswith("train_segment "):
            risks.append(HangRisk(key, planned.nodes, planned.runtime_min))
            continue
        name = job.wildcards["experiment"]
        bounds = segment_bounds(
            EXPERIMENTS[name].experiment, CLUSTER.watchdog, f"checkpoints/{name}"
        )
        risks.append(
            HangRisk(
                key,
                planned.nodes,
                planned.runtime_min,
                bound_min=bounds.step / 60,
                worst_min=max(bounds.start, bounds.save) / 60,
                reason=bounds.reason["step"],
            )
        )
    return risks


def resiliency_lines(trained):
    """With the hang lines: which of Megatron-LM's own resiliency features the segments of
    the megatron experiments among ``trained`` use, as the site probe found the image
    (hpcllm.models.megatron_resiliency; the segment reads the same record at its start).
    """
    from hpcllm.models import megatron_resiliency

    settings = {
        name: megatron_resiliency.setting_of(EXPERIMENTS[name].experiment)
        for name in trained
        if EXPERIMENTS[name].experiment["engine"] == "megatron"
    }
    found, source = megatron_resiliency.from_record(
        _chain_site.probe_record_path(
            CLUSTER, (container_image("train", check=False) or [None])[0]
        )
    )
    probed = globals().get("PREFLIGHT", False)
    return [
        f"  {line}"
        for line in megatron_resiliency.plan_lines(settings, found, source, probed)
    ]


def check_plan_cost(dag):
    """Print the cost of the jobs of ``dag`` that Snakemake will run and hold GPU nodes
    (exactly those: -F, -R, --forcerun, --until and targets included), and the time to
    train the experiments among them; stop a real run over the limit (a dry run only
    warns)."""
    jobs, cpu_only, experiments = [], [], set()
    for job in dag.needrun_jobs():
        if job.rule.name == "train_segment":
            experiments.add(job.wildcards["experiment"])
        if holds_gpu_nodes(job):
            jobs.append(planned_job(job))
            if not asks_for_gpus(job):
                cpu_only.append(jobs[-1])
    for name in sorted(experiments):
        for warning in SEGMENT_JOBS[name].warnings:
            logger.warning(f"Warning: {warning}")
    costs = cost_per_rule(jobs, CLUSTER.billed_gpus_per_node)
    for line in describe_cost(costs, CLUSTER.name):
        logger.info(line)
    for line in describe_cpu_only(
        cost_per_rule(cpu_only, CLUSTER.billed_gpus_per_node),
        costs,
        CLUSTER.name,
        CLUSTER.no_cpu_partition,
    ):
        logger.info(line)
    for line in describe_hang_risk(
        hang_risks(dag), CLUSTER.name, CLUSTER.billed_gpus_per_node
    ):
        logger.info(line)
    for line in resiliency_lines(sorted(experiments)):
        logger.info(line)
    for line in describe_training(
        training_estimates(sorted(experiments)), CLUSTER.name
    ):
        logger.info(line)
    problem = over_limit(costs, config[MAX_GPU_HOURS_KEY], CLUSTER.name)
    if problem and not (workflow.dryrun or workflow.touch):
        raise WorkflowError(f"Nothing was submitted: {problem}")
    elif problem:
        logger.warning(f"Warning: {problem}")


def check_training_reruns(dag):
    """Refuse segment jobs asked for again (forced, or their data made again) whose
    checkpoint holds their target already (hpcllm.training.plan.reruns); a dry run and
    --touch only warn."""
    from hpcllm.training.checkpoints.tracker import CheckpointError, latest_iteration
    from hpcllm.training.plan.experiment import target_iteration
    from hpcllm.training.plan.reruns import asked, refusal, stale_reruns

    def reached(name):
        try:
            return latest_iteration(f"checkpoints/{name}")
        except CheckpointError:  # the segment's job names what is wrong
            return None

    flags = workflow.dag_settings
    by_user = bool(flags.forcerun or flags.forceall or flags.forcetargets)
    jobs = [job for job in dag.needrun_jobs() if job.rule.name == "train_segment"]
    # (changed settings: the plan warned, and the job refuses naming them)
    names = {job.wildcards["experiment"] for job in jobs}
    refused = {name: settings_refused(name) for name in names}
    planned = [
        (
            job.wildcards["experiment"],
            int(job.wildcards["k"]),
            asked(
                job.wildcards["experiment"],
                dag.reason(job).forced and by_user,
                dag.reason(job).updated_input,
                dag.reason(job).updated_input_run,
            ),
        )
        for job in jobs
        if not refused[job.wildcards["experiment"]]
    ]
    target = lambda name, k: target_iteration(EXPERIMENTS[name].experiment, k)
    problems = [
        refusal(name, segments, reached(name))
        for name, segments in stale_reruns(planned, reached, target).items()
    ]
    # a layout Megatron cannot load the checkpoints with: refused before the site sees it
    # (a dry run: the plan warned already, training_functions.smk)
    layouts = list(filter(None, (layout_refused(name) for name in sorted(names))))
    if (problems or layouts) and not (workflow.dryrun or workflow.touch):
        raise WorkflowError("Nothing was submitted: " + "\n".join(problems + layouts))
    for problem in problems:
        logger.warning(f"Warning: {problem}")


# The plan's cost is priced, and reruns of training checked, from the DAG Snakemake
# executes, once it is built and before any job is submitted. Snakemake calls no hook of
# the workflow's there in a dry run (onstart runs for real runs only), but both kinds of
# run print the DAG's job counts (DAG.stats) at that point: the cost is printed, and a
# real run over the limit stopped, just before them. Only in this process: jobs re-read
# the Snakefile, price nothing.
if workflow.is_main_process:
    from snakemake.dag import DAG as _DAG

    _dag_stats = _DAG.stats
    _priced = set()  # a dry run prints the stats twice: the cost once

    def _stats_after_cost(dag):
        if id(dag) not in _priced:
            _priced.add(id(dag))
            check_training_reruns(dag)
            trained = sorted(
                {
                    job.wildcards["experiment"]
                    for job in dag.needrun_jobs()
                    if job.rule.name == "train_segment"
                }
            )
            for line in training_calendar(trained) if trained else []:
                logger.info(line)
            if CLUSTER.uses_slurm and CLUSTER.gpus_per_node:
                check_plan_cost(dag)  # the segments' warnings with the cost lines
            else:  # no cost to print; what the segments run without is still said
                for name in trained:
                    for warning in SEGMENT_JOBS[name].warnings:
                        logger.warning(f"Warning: {warning}")
        return _dag_stats(dag)

    _DAG.stats = _stats_after_cost
