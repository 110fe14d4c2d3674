# The training stage's globals, plan-time checks and input/params functions (its rules:
# training.smk, which includes this file first).
from hpcllm.training.campaign import chain_site as _chain_site
from hpcllm.training.plan.experiment import prepare_experiment

TRAINING = config["training"]
EXPERIMENTS = {}
for _name, _raw in TRAINING["experiments"].items():
    try:
        EXPERIMENTS[_name] = prepare_experiment(_name, _raw, TEXT, CLUSTER)
    except ValueError as e:
        raise _WorkflowError(str(e))
from hpcllm.training.engines.command import engine_problem

# The experiments the plan trains, each on an engine this cluster has.
for _name in TRAINING.get("run") or EXPERIMENTS:
    _problem = _name in EXPERIMENTS and engine_problem(
        _name, EXPERIMENTS[_name].experiment["engine"], CLUSTER
    )
    if _problem:
        raise _WorkflowError(_problem)
from hpcllm.training.plan.job_plan import segment_job

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
from hpcllm.models.megatron_args import transformer_impl_for
from hpcllm.training.plan.reshard import layout_settings as _layout_settings
from hpcllm.training.plan.settings import (
    plan_warning,
    weight_settings as _weight_settings,
)

for _name, _prepared in EXPERIMENTS.items():
    # Settings that differ from what the checkpoints were trained with: the reason the
    # segments are planned again, and why they will refuse; or a layout Megatron cannot
    # load them with (a real run submits nothing: check_training_reruns).
    _warning = plan_warning(
        _name,
        f"checkpoints/{_name}",
        _weight_settings(_prepared, transformer_impl_for(CLUSTER)),
        _layout_settings(_prepared, transformer_impl_for(CLUSTER)),
    )
    if _warning:
        logger.warning(f"Warning: {_warning}")


def training_targets():
    names = TRAINING.get("run") or list(EXPERIMENTS)
    return [
        path
        for name in names
        for path in (
            f"results/train/{name}/seg{EXPERIMENTS[name].experiment['segments']}.json",
            f"results/train/{name}/loss.png",
        )
    ]


def index_cache_dir(wildcards):
    return f"data/index_cache/{wildcards.experiment}"


def all_segment_records(wildcards):
    segments = EXPERIMENTS[wildcards.experiment].experiment["segments"]
    return [
        f"results/train/{wildcards.experiment}/seg{k}.json"
        for k in range(1, segments + 1)
    ]


def segment_engine_logs(wildcards):
    segments = EXPERIMENTS[wildcards.experiment].experiment["segments"]
    return [
        f"logs/train_segment/{wildcards.experiment}/seg{k}.engine.log"
        for k in range(1, segments + 1)
    ]


def experiment_seq_length(wildcards):
    return EXPERIMENTS[wildcards.experiment].experiment["model"]["seq_length"]


def segment_attempt(wildcards, attempt):
    return attempt


def segment_retry_refused(experiment, k, attempt):
    from hpcllm.training.campaign import attempts
    from hpcllm.training.checkpoints import tracker as checkpoints

    try:
        latest = checkpoints.latest_iteration(f"checkpoints/{experiment}") or 0
    except checkpoints.CheckpointError:
        return True
    entries = attempts.load(f"logs/train_segment/{experiment}/seg{k}.attempts.json")
    return attempts.refusal(entries, attempt, latest) is not None


def settings_refused(experiment):
    from hpcllm.models.megatron_args import transformer_impl_for
    from hpcllm.training.plan.reshard import layout_settings
    from hpcllm.training.plan.settings import plan_warning, weight_settings

    impl = transformer_impl_for(CLUSTER)
    settings = weight_settings(EXPERIMENTS[experiment], impl)
    layout = layout_settings(EXPERIMENTS[experiment], impl)
    return (
        plan_warning(experiment, f"checkpoints/{experiment}", settings, layout)
        is not None
    )


def layout_refused(experiment):
    """Why the checkpoints cannot be resumed with the experiment's layout, or None."""
    from hpcllm.models.megatron_args import transformer_impl_for
    from hpcllm.training.plan.reshard import layout_settings
    from hpcllm.training.plan.settings import layout_plan_refusal, weight_settings

    impl = transformer_impl_for(CLUSTER)
    return layout_plan_refusal(
        experiment,
        f"checkpoints/{experiment}",
        weight_settings(EXPERIMENTS[experiment], impl),
        layout_settings(EXPERIMENTS[experiment], impl),
    )


def prepared_experiment(wildcards):
    return EXPERIMENTS[wildcards.experiment]


def weight_settings(wildcards):
    """The experiment's weight-determining settings, one key=value line each: a param, so
    that changing one replans its segments (hpcllm.training.plan.settings)."""
    from hpcllm.models.megatron_args import transformer_impl_for
    from hpcllm.training.plan.settings import param_text, weight_settings

    prepared = EXPERIMENTS[wildcards.experiment]
    return param_text(weight_settings(prepared, transformer_impl_for(CLUSTER)))


def data_settings(wildcards):
    """What the index cache is built from (blend, split, sequence length, tokenizer, seed)."""
    from hpcllm.training.plan.settings import data_settings, param_text

    return param_text(data_settings(EXPERIMENTS[wildcards.experiment]))


def index_cache_runtime(wildcards):
    """prepare_data_cache's time limit: sized from the samples it indexes where the job
    holds a GPU node (hpcllm.cpu_limits), 120 minutes or more elsewhere."""
    from hpcllm.cpu_limits import cpu_job_minutes, index_cache_minutes

    prepared = EXPERIMENTS[wildcards.experiment]
    exp = prepared.experiment
    samples = (
        exp["segments"] * exp["iterations_per_segment"] * prepared.layout.global_batch
    )
    return cpu_job_minutes(
        120, index_cache_minutes(samples), CLUSTER.whole_nodes, CLUSTER.max_minutes
    )


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
    """The files the engines read (hpcllm.text.tokenizers_config.engine_files): a trained
    tokenizer's vocab.json and merges.txt, the tokenizer_folder of a given tokenizer.json,
    or the GPT-2 files a type: files tokenizer names."""
    return list(EXPERIMENTS[wildcards.experiment].tokenizer_files)


def training_container(wildcards):
    """The training image on clusters with a container runtime, for either engine (the
    torch engine needs the GPU build of PyTorch there too); none where the runtime is none.
    """
    return container_image("train")


def segment_nodes(wildcards, attempt):
    """The layout's nodes; one for a retry that will refuse to run (it only reports), and
    for a segment that will refuse a checkpoint trained with other settings."""
    if attempt > 1 and segment_retry_refused(
        wildcards.experiment, wildcards.k, attempt
    ):
        return 1
    if settings_refused(wildcards.experiment):
        return 1
    return EXPERIMENTS[wildcards.experiment].experiment["layout"]["nodes"]


def segment_runtime(wildcards):
    """The segment's time limit in minutes (60 where there is no GPU to size it for)."""
    return SEGMENT_JOBS[wildcards.experiment].limit_minutes or 60


def segment_slurm_extra(wildcards, attempt):
    """Slurm signals the job steps (srun -> torchrun -> the engine) before the time limit:
    SIGUSR2, which torchrun ignores and the engines save on, early enough for the save
    measured so far (hpcllm.training.campaign.signal_lead; the plan says which lead).
    A retry after a hang avoids the node of its suspect rank, the one that stopped
    reporting first or, every rank alive, made no progress first (--exclude;
    hpcllm.training.campaign.attempts.suspect_nodes); a segment after one whose record
    names a straggler beyond the cluster's factor avoids that node
    (hpcllm.training.campaign.stragglers)."""
    from hpcllm.training.campaign import attempts, signal_lead, stragglers

    experiment = EXPERIMENTS[wildcards.experiment].experiment
    save = f"checkpoints/{wildcards.experiment}"
    if (
        workflow.is_main_process
        and CLUSTER.uses_slurm
        and wildcards.experiment not in _LEAD_NOTED
    ):
        _LEAD_NOTED.add(wildcards.experiment)
        note = signal_lead.lead_note(
            experiment, signal_lead.measured(save), wildcards.experiment
        )
        (logger.warning if note.startswith("Warning") else logger.info)(note)
    nodes = []
    if int(wildcards.k) > 1:  # the segment before it: its record is this one's input
        nodes += stragglers.nodes_to_exclude(
            f"results/train/{wildcards.experiment}/seg{int(wildcards.k) - 1}.json"
        )
    if attempt > 1:
        record = (
            f"logs/train_segment/{wildcards.experiment}/seg{wildcards.k}.attempts.json"
        )
        nodes += attempts.suspect_nodes(attempts.load(record), attempt)
    nodes = list(dict.fromkeys(nodes))
    exclude = f" --exclude={','.join(nodes)}" if nodes else ""
    return (
        f"--ntasks-per-node=1 {signal_lead.slurm_signal(experiment, save)}"
        f"{threads_per_core_flag()}{exclude}"
    )


_LEAD_NOTED = set()  # experiments whose signal lead the plan stated


def threads_per_core_flag():
    """Cores, not hardware threads, where the site's Slurm counts those as CPUs (JSC)."""
    return " --threads-per-core=1" if CLUSTER.threads_per_core > 1 else ""


from hpcllm.models.megatron_args import container_commit_mismatch
from hpcllm.training.plan.passes import dataset_tokens, files_tokens, passes_report


def source_tokens(source, tok):
    """A source's tokens where its merged dataset exists, else an upper estimate from its
    files where they are here (a hub source to fetch: unknown until then)."""
    known = dataset_tokens(f"data/tokenized/{tok}/{source}_text_document")
    if known or source not in SOURCES:
        return known
    cfg = SOURCES[source]
    if cfg["type"] == "local":
        return files_tokens(resolve_local_files(source, cfg))
    mirror = cfg.get("mirror")
    if mirror and os.path.isdir(mirror):
        from hpcllm.text.sources import hub_data_files

        try:
            files = hub_data_files(cfg, mirror)
        except Exception:  # a mirror the text stage reports on; no estimate here
            files = None
        if files:
            return files_tokens(files)
    return None


# Every experiment's passes over its data, and a plan that reads a source more often than
# data.max_passes allows stopped (the exact figures again in prepare_data_cache).
if workflow.is_main_process:
    for _name, _prepared in EXPERIMENTS.items():
        _line, _problem = passes_report(
            _name,
            _prepared.experiment,
            _prepared.layout.global_batch,
            {
                _source: source_tokens(
                    _source, _prepared.experiment["data"]["tokenizer"]
                )
                for _source in _prepared.experiment["data"]["sources"]
            },
        )
        logger.info(_line)
        if _problem:
            raise _WorkflowError(_problem)

if any(p.experiment["engine"] == "megatron" for p in EXPERIMENTS.values()):
    for _image in container_image("train", check=False):
        _definition = config["containers"]["images"][
            os.path.basename(_image)[: -len(".sif")]
        ]
        if not os.path.exists(_definition):
            _definition = os.path.join(HPCLLM_ROOT, _definition)
        _mismatch = container_commit_mismatch(open(_definition).read(), _definition)
        if _mismatch:
            logger.warning(f"Warning: {_mismatch}")
for _name in TRAINING.get("run") or []:
    if _name not in EXPERIMENTS:
        raise _WorkflowError(
            f"training.run names '{_name}', which is not in training.experiments "
            f"({', '.join(EXPERIMENTS) or 'none defined'})"
        )

# A chain on a Slurm run: train_segment runs on the login node, submits the experiment's
# chain of Slurm jobs (or reattaches to it) and waits for its segment
# (hpcllm.training.campaign.chain; docs/training.md). Elsewhere it trains in place.
# training.chain unset: a chain where the site's answer is known (the site probe's record,
# else the cluster fact) or this run's site probe finds it out before the first segment
# (PREFLIGHT: a Slurm cluster with GPUs); the chain's script submits it as the answer says.
# Decided by the controller alone: a chain's train_segment is its localrule, so a job
# process never runs it; and a probe record written since the controller's parse must not
# turn a plugin job's train_segment into the chain's waiting script (which would submit a
# chain from inside the job, whose nodes the chain's job then waits for).
_SLURM_RUN = (
    workflow.is_main_process
    and CLUSTER.uses_slurm
    and (
        getattr(workflow.executor_plugin, "name", None)
        not in ("local", "slurm-jobstep")
    )
)
CHAINED = False
if _SLURM_RUN:  # (a job process reads no probe record)
    _CHAIN_ANSWER = _chain_site.site_answer(
        CLUSTER,
        _chain_site.probe_record_path(
            CLUSTER, (container_image("train", check=False) or [None])[0]
        ),
    )
    _PROBED = globals().get("PREFLIGHT", False)  # (preflight.smk, included before)
    CHAINED = _chain_site.chained(TRAINING["chain"], _CHAIN_ANSWER, _PROBED)
    if EXPERIMENTS:
        logger.info(_chain_site.plan_note(TRAINING["chain"], _CHAIN_ANSWER, _PROBED))
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
                for key in (
                    "requeue",
                    "no_requeue",
                    "qos",
                    "reservation",
                    "exclude_failed_nodes",
                )
            }
        )
    )


if "train_preflight" not in globals():  # a Snakefile without preflight.smk's include

    def train_preflight(wildcards):
        return []


# layout: auto (hpcllm.training.plan.autolayout): the candidates that fit, the measuring
# job's record where it ran, and what the search costs, with every plan.
AUTO_EXPERIMENTS = [n for n, p in EXPERIMENTS.items() if p.auto is not None]
from hpcllm.training.plan import autolayout as _autolayout

if workflow.is_main_process:

    for _name in AUTO_EXPERIMENTS:
        _prepared = EXPERIMENTS[_name]
        _table, _warning = _autolayout.table(
            _name,
            _prepared.auto,
            _prepared.experiment["segments"]
            * _prepared.experiment["iterations_per_segment"],
            _prepared.layout.gpus,
        )
        logger.info(_table)
        if _warning:
            logger.warning(f"Warning: {_warning}")
# The measuring job's node as train_segment's (the profile's GPUs, cores and memory).
MEASURE_RESOURCES = {
    _key: _value
    for _key, _value in _profile_resources.get("train_segment", {}).items()
    if _key in ("slurm_partition", "gres", "cpus_per_task", "mem_mb")
}


def layout_record(wildcards):
    """The measuring job's record of an auto layout, for every segment (none otherwise).
    Ancient: the campaign keeps the layout it started with."""
    if wildcards.experiment not in AUTO_EXPERIMENTS:
        return []
    return [ancient(f"results/layout/{wildcards.experiment}.json")]


def measure_nodes(wildcards):
    return EXPERIMENTS[wildcards.experiment].auto.nodes


def measure_runtime(wildcards):
    """Minutes: the most the search may run (every round of the two best predicted,
    hpcllm.training.plan.autolayout.search_seconds; each launch's start-up the training
    canary's where it ran and took longer than assumed) with the margin, within the
    site's limit; or 30 without a GPU rate to predict it. The job starts no launch that
    would not fit the time left."""
    from hpcllm.work_time import MARGIN, ROUND_MINUTES

    prepared = EXPERIMENTS[wildcards.experiment]
    auto = prepared.auto
    if auto.job_seconds is None:
        return 30
    start = _autolayout.start_seconds(train_preflight(wildcards))
    seconds = _autolayout.search_seconds(
        list(auto.candidates[: auto.measure]),
        _autolayout.settings(prepared.experiment["layout"]),
        start,
        worst=True,
    )
    minutes = MARGIN * seconds / 60 + ROUND_MINUTES
    return min(CLUSTER.max_minutes, ROUND_MINUTES * -(-int(minutes) // ROUND_MINUTES))


def measure_key(wildcards):
    """What the search measures (the candidates): a param, so a change measures again."""
    auto = EXPERIMENTS[wildcards.experiment].auto
    return " ".join(c.name for c in auto.candidates[: auto.measure])


def measure_slurm_extra(wildcards):
    return f"--ntasks-per-node=1{threads_per_core_flag()}"
