# Config validation, wildcard constraints and the input/params functions of every rule.
import os
import sys
from types import SimpleNamespace

# The package, importable also where it is not installed.
sys.path.insert(0, os.path.join(workflow.basedir, "src"))

from snakemake.utils import validate

from hpcllm.configuration import SECTIONS, check_section
from hpcllm.text.sources import offline_source_error, resolve_local_files
from hpcllm.text.tokenizers_config import plan_problem as tokenizer_plan_problem
from hpcllm.text.tokenizers_config import retrain_warning, tokenizer_files

check_section("", config, f"{workflow.basedir}/workflow/schemas/config.schema.yaml")
validate(config, "../schemas/config.schema.yaml")
# Each section has its own schema file. check_section reports every error by its key;
# validate then fills in the defaults (one file at a time: snakemake's validate does not
# fill defaults behind a $ref to another file).
for _section in SECTIONS:
    config.setdefault(_section, {})
    check_section(
        _section,
        config[_section],
        f"{workflow.basedir}/workflow/schemas/{_section}.schema.yaml",
    )
    validate(config[_section], f"../schemas/{_section}.schema.yaml")

TEXT = config["text"]
SOURCES = TEXT["sources"]
TOKENIZERS = TEXT["tokenizers"]
TOKENIZE = TEXT["tokenize"]
# What the jobs of each rule depend on, and only that. Params are part of what
# Snakemake compares to decide a rerun, so adding a source or a tokenizer must not
# change the params of the jobs of the others.
TEXT_DEFAULTS = {k: TEXT[k] for k in ("on_bad_record", "max_document_bytes")}
TOKENIZE_SETTINGS = {
    k: TOKENIZE[k]
    for k in ("append_eod", "encoder", "batch_bytes", "special_tokens_in_text")
}

# A missing input file is reported here, at plan time (dry run included).
for _name, _source in SOURCES.items():
    if _source["type"] == "local":
        resolve_local_files(_name, _source)
for _name in TOKENIZE["tokenizers"]:
    if _name not in TOKENIZERS:
        raise ValueError(
            f"text.tokenize.tokenizers names '{_name}', which is not in text.tokenizers "
            f"({', '.join(TOKENIZERS) or 'none defined'})"
        )
# A tokenizer without its end-of-document token, or whose given files cannot be loaded
# (by the controller only: it loads a given tokenizer.json, which jobs need not repeat).
if workflow.is_main_process:
    for _name in TOKENIZE["tokenizers"]:
        _problem = tokenizer_plan_problem(_name, TOKENIZERS[_name])
        if _problem:
            raise ValueError(_problem)

# The cluster this run targets: config/clusters/<cluster>.yaml (the profile sets
# `cluster`). Site facts left to the user and profile resources that name an unset
# environment variable stop the run here, before anything is submitted.
from snakemake.exceptions import WorkflowError as _WorkflowError

from hpcllm.clusters import (
    ClusterError,
    cluster_from_profile,
    load_cluster,
    plan_errors,
    profile_cluster,
    profile_errors,
)
from hpcllm.plan_cost import (
    MAX_GPU_HOURS_KEY,
    TrainingEstimate,
    cost_per_rule,
    describe_training,
    measured_tflops,
    over_limit,
    runtime_minutes,
)
from hpcllm.plan_cost import Job as PlanJob
from hpcllm.plan_cost import describe as describe_cost
from hpcllm.text.shard_pool import batch_minutes

_clusters_dir = "config/clusters"
if not os.path.isdir(_clusters_dir):  # a working directory without its own config/
    _clusters_dir = os.path.join(workflow.basedir, "config", "clusters")
try:
    CLUSTER = load_cluster(config["cluster"], root=_clusters_dir)
    # A --config on the command line replaces the profile's config: (cluster included):
    # the cluster is read from the profile itself (hpcllm.clusters.profile_cluster).
    _cluster_name, _note = cluster_from_profile(
        config["cluster"],
        profile_cluster(sys.argv, roots=[os.getcwd(), os.environ.get("PWD", ".")]),
    )
    if _note:
        logger.info(_note)
        config["cluster"] = _cluster_name
        CLUSTER = load_cluster(_cluster_name, root=_clusters_dir)
        # Jobs re-read the workflow with the command line's --config: pass it on.
        workflow.config_settings.config_args = [
            *(workflow.config_settings.config_args or []),
            f"cluster={_cluster_name!r}",
        ]
except ClusterError as e:
    raise _WorkflowError(str(e))
_resources = workflow.resource_settings
_profile_resources = {
    scope: {name: getattr(value, "raw", value) for name, value in values.items()}
    for scope, values in [
        ("default-resources", _resources.default_resources or {}),
        *_resources.overwrite_resources.items(),
    ]
}
_plan_errors = plan_errors(CLUSTER) + profile_errors(_profile_resources)
if _plan_errors:
    raise _WorkflowError(
        f"Jobs for cluster '{CLUSTER.name}' cannot be planned until this is set:\n"
        + "\n".join(f"  - {e}" for e in _plan_errors)
    )


wildcard_constraints:
    source="|".join(SOURCES) or "NONE",
    tok="|".join(TOKENIZERS) or "NONE",
    shard=r"\d{4}\d*",
    batch=r"\d{4}\d*",


def shard_ids(source):
    return [f"{i:04d}" for i in range(SOURCES[source]["shards"])]


def fetched(source):
    """The manifest of the login-node fetch of a hub source without a mirror, or None
    (local files and mirrors are read in place: no login-node step)."""
    cfg = SOURCES[source]
    if cfg["type"] != "hub" or cfg.get("mirror") or os.environ.get("HPCLLM_HF_MIRROR"):
        return None
    return f"data/hub/{source}/fetched.json"


def source_files(source):
    """What a source's jobs read: its local files, or the fetch's manifest."""
    cfg = SOURCES[source]
    if cfg["type"] == "local":
        return [os.path.normpath(f) for f in resolve_local_files(source, cfg)]
    check_hub_source(source)  # a mirror that is not there, a fetch without internet
    return [f for f in [fetched(source)] if f]


def source_inputs(wildcards):
    return source_files(wildcards.source)


def read_config(source):
    """The source's config as its jobs read it: a fetched hub source from its mirror."""
    cfg = SOURCES[source]
    if fetched(source):
        return {**cfg, "mirror": f"data/hub/{source}/files"}
    return cfg


def source_read_config(wildcards):
    return read_config(wildcards.source)


def shard_manifests(wildcards):
    return [f"{p}.manifest.json" for p in tokenized_shard_prefixes(wildcards)]


def tokenized_manifests(wildcards):
    """The shards' manifests as a merge's input where one-shard jobs write them (a batch's
    record stands for its shards' files)."""
    return shard_manifests(wildcards) if shards_per_job() == 1 else []


def source_min_documents(wildcards):
    return SOURCES[wildcards.source].get("min_documents", TEXT["min_documents"])


def source_config(wildcards):
    return SOURCES[wildcards.source]


def hub_source_reachable(wildcards):
    """No input; stops the plan when the source is on the hub and downloads run where
    there is no internet (config/clusters: internet.login), saying what to stage."""
    check_hub_source(wildcards.source)
    return []


def check_hub_source(source):
    """Stops the plan when a hub source's mirror is not there, or when it has none and
    the login nodes, where the fetch runs, have no internet."""
    problem = offline_source_error(
        source,
        SOURCES[source],
        os.environ.get("HPCLLM_HF_MIRROR"),
        online=CLUSTER.internet.login,
        site=CLUSTER.description,
        facts=CLUSTER.path,
    )
    if problem:
        raise _WorkflowError(problem)


def source_num_shards(wildcards):
    return SOURCES[wildcards.source]["shards"]


def tokenizer_training(wildcards):
    """What training depends on besides its input shards (``sources`` picks those)."""
    cfg = TOKENIZERS[wildcards.tok]
    return {k: cfg[k] for k in ("vocab_size", "special_tokens", "sample_documents")}


def tokenizer_use(wildcards):
    """What encoding depends on besides the tokenizer's files."""
    cfg = TOKENIZERS[wildcards.tok]
    return {k: cfg[k] for k in ("type", "eod_token", "vocab_size") if k in cfg}


def training_sources(tok):
    return TOKENIZERS[tok].get("sources") or list(SOURCES)


def tokenizer_training_inputs(wildcards):
    return [
        f for source in training_sources(wildcards.tok) for f in source_files(source)
    ]


def tokenizer_training_sources(wildcards):
    """The sources a tokenizer trains on (their configs as read), in order."""
    return {
        source: {**read_config(source), "num_shards": SOURCES[source]["shards"]}
        for source in training_sources(wildcards.tok)
    }


def tokenized_source_shards(source):
    """Any tokenized shard of a source (evidence that it is not new)."""
    return [
        f"data/tokenized/{tok}/{source}/{shard}_text_document.manifest.json"
        for tok in TOKENIZERS
        for shard in shard_ids(source)
    ]


# A trained tokenizer that a new source retrains says so, and how to pin it (plan time).
if workflow.is_main_process:
    for _name, _tok in TOKENIZERS.items():
        _warning = retrain_warning(_name, _tok, SOURCES, tokenized_source_shards)
        if _warning:
            logger.warning(f"Warning: {_warning}")


def tokenizer_inputs(wildcards):
    return tokenizer_files(wildcards.tok, TOKENIZERS[wildcards.tok])


# Given (type: files) tokenizers named by a tokenizer.json: rule tokenizer_folder's.
GIVEN_JSON_TOKENIZERS = (
    "|".join(n for n, t in TOKENIZERS.items() if t.get("tokenizer_json")) or "NONE"
)


def given_tokenizer_json(wildcards):
    return TOKENIZERS[wildcards.tok]["tokenizer_json"]


def tokenized_shard_prefixes(wildcards):
    return [
        f"data/tokenized/{wildcards.tok}/{wildcards.source}/{shard}_text_document"
        for shard in shard_ids(wildcards.source)
    ]


# Threads of one shard's tokenize (the tokenize rule's; a batch runs shards of this many).
TOKENIZE_THREADS = 4


def shards_per_job():
    """Shards per tokenize job (text.tokenize.shards_per_job; auto: a whole node's worth
    where every job holds a whole node, else 1)."""
    n = TOKENIZE.get("shards_per_job", "auto")
    if n == "auto":
        if CLUSTER.whole_nodes:
            return max(1, CLUSTER.cpus_per_node // TOKENIZE_THREADS)
        return 1
    return n


def batch_ids(source):
    n = shards_per_job()
    return [f"{i:04d}" for i in range(-(-SOURCES[source]["shards"] // n))]


def batch_shards(wildcards):
    """The shard ids of batch ``wildcards.batch`` of ``wildcards.source``."""
    n, b = shards_per_job(), int(wildcards.batch)
    return shard_ids(wildcards.source)[b * n : (b + 1) * n]


def batch_inputs(wildcards):
    """A batch reads its shards' blocks of the source's own files."""
    return source_files(wildcards.source)


def tokenize_threads(wildcards):
    """A shard's threads: TOKENIZE_THREADS on a cluster (every job its own cores). On this
    machine, with fewer cores than the source's shards need, the shards share them so
    that they run side by side (one job's start-up then overlaps another's encoding):
    4 shards of a 50 MB corpus on 2 cores took 6.4-6.6 s at 1 thread each against
    8.8-9.8 s at 2 each, one after the other (docs/text.md)."""
    if CLUSTER.uses_slurm:
        return TOKENIZE_THREADS
    try:
        cores = workflow.cores
    except _WorkflowError:  # no --cores (a dry run without a profile)
        return TOKENIZE_THREADS
    return max(1, min(TOKENIZE_THREADS, cores // source_num_shards(wildcards)))


def batch_threads(wildcards):
    """A batch's threads: TOKENIZE_THREADS per shard, at most a node's cores."""
    threads = TOKENIZE_THREADS * len(batch_shards(wildcards))
    return min(threads, CLUSTER.cpus_per_node) if CLUSTER.uses_slurm else threads


def batch_runtime(wildcards, input, threads):
    """A batch's time limit from its work (hpcllm.text.shard_pool.batch_minutes)."""
    # The source's bytes on disk (its files) spread evenly over its shards.
    shards = batch_shards(wildcards)
    per_shard = sum(os.path.getsize(f) for f in input.shards) / source_num_shards(
        wildcards
    )
    return batch_minutes(
        [int(per_shard)] * len(shards),
        max(1, threads // TOKENIZE_THREADS),
        max_minutes=CLUSTER.max_minutes,
    )


def tokenized_shards(wildcards):
    """What a merge waits for: the batches' records, or the shards of one-shard jobs."""
    if shards_per_job() > 1:
        return expand(
            "data/tokenized/{tok}/{source}/batch{batch}.json",
            tok=wildcards.tok,
            source=wildcards.source,
            batch=batch_ids(wildcards.source),
        )
    return [
        p + ext for p in tokenized_shard_prefixes(wildcards) for ext in (".bin", ".idx")
    ]


def text_targets():
    return expand(
        "data/tokenized/{tok}/{source}_text_document.{ext}",
        tok=TOKENIZE["tokenizers"],
        source=SOURCES,
        ext=("bin", "idx"),
    )


def all_targets(wildcards):
    """The default target. On a GPU cluster: what a user runs there (text data, real
    image datasets, training on the megatron engine, benchmark points the config asks
    for); the built-in laptop examples (the torch-engine tiny_local, the generated image
    samples) run there only when named (`training.run`, or as a target). Elsewhere (a
    laptop, a CPU-only cluster such as the test cluster) everything configured."""
    if not (CLUSTER.uses_slurm and CLUSTER.gpus_per_node):
        return (
            text_targets()
            + vision_targets()
            + training_targets()
            + benchmark_targets()
            + results_page_target()
        )
    samples = tuple(
        f"data/vision/{n}/" for n, c in IMAGE_DATASETS.items() if "sample" in c
    )
    vision = [t for t in vision_targets() if not t.startswith(samples)]
    training = training_targets()
    if not TRAINING.get("run"):
        training = [
            f"results/train/{name}/seg{prepared.experiment['segments']}.json"
            for name, prepared in EXPERIMENTS.items()
            if prepared.experiment["engine"] != "torch"
        ]
    check_plan_cost(training, vision)
    return (
        text_targets() + vision + training + benchmark_targets() + results_page_target()
    )


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


# ---- vision (the globals these use are set in vision.smk)


def vision_targets():
    return [
        f"data/vision/{name}/{split}.lmdb"
        for name, cfg in IMAGE_DATASETS.items()
        if is_configured(cfg)
        for split in cfg["splits"]
    ]


def image_dataset_config(wildcards):
    return IMAGE_DATASETS[wildcards.dataset]


def image_tree(wildcards):
    """The split's folder: made by make_sample_images for a sample, else the user's tree."""
    cfg = IMAGE_DATASETS[wildcards.dataset]
    root = dataset_root(wildcards.dataset, cfg)
    return root if "sample" in cfg else f"{root}/{wildcards.split}"


# ---- containers (the globals these use are set in containers.smk)


def containers_targets():
    return []  # built when a GPU step needs one (container_image)


def container_image(purpose, check=True):
    """[containers/<image>.sif] for a GPU step of ``purpose`` ("train", "vision"); [] without.

    GPU rules list it as an input, so the image is built before them. With ``check``, an
    image that can be neither found nor built here (a site without internet or builds)
    stops the plan, saying where to put it.
    """
    image = image_for(CLUSTER, purpose, CONTAINERS["use"])
    if image is None:
        return []
    sif = f"containers/{image}.sif"
    problem = check and image_plan_error(CLUSTER, image, sif, image_definition(image))
    if problem:
        raise WorkflowError(problem)
    return [sif]


def image_definition(image):
    path = CONTAINERS["images"][image]
    if not os.path.isabs(path) and not os.path.exists(path):
        path = os.path.join(workflow.basedir, path)
    return path


def container_recipe(wildcards):
    """What the site's build method reads: the definition file, or its cotainr conda
    environment. Also where a missing build tool is caught: while the DAG is built for a
    real run (a dry run or --dag only warns: it builds nothing)."""
    try:
        build_executable(CLUSTER)
    except ContainerRuntimeError as e:
        if workflow.executor_plugin is not None and not workflow.dryrun:
            raise WorkflowError(str(e))
        logger.warning(f"Warning: {e}")
    return str(recipe_path(CLUSTER, image_definition(wildcards.image)))


# ---- training (the globals these use are set in training.smk)


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
    from hpcllm.training import attempts, checkpoints

    try:
        latest = checkpoints.latest_iteration(f"checkpoints/{experiment}") or 0
    except checkpoints.CheckpointError:
        return True
    entries = attempts.load(f"logs/train_segment/{experiment}/seg{k}.attempts.json")
    return attempts.refusal(entries, attempt, latest) is not None


def settings_refused(experiment):
    from hpcllm.training.megatron_args import transformer_impl_for
    from hpcllm.training.settings import plan_warning, weight_settings

    settings = weight_settings(EXPERIMENTS[experiment], transformer_impl_for(CLUSTER))
    return plan_warning(experiment, f"checkpoints/{experiment}", settings) is not None


def prepared_experiment(wildcards):
    return EXPERIMENTS[wildcards.experiment]


def weight_settings(wildcards):
    """The experiment's weight-determining settings, one key=value line each: a param, so
    that changing one replans its segments (hpcllm.training.settings)."""
    from hpcllm.training.megatron_args import transformer_impl_for
    from hpcllm.training.settings import param_text, weight_settings

    prepared = EXPERIMENTS[wildcards.experiment]
    return param_text(weight_settings(prepared, transformer_impl_for(CLUSTER)))


def data_settings(wildcards):
    """What the index cache is built from (blend, split, sequence length, tokenizer, seed)."""
    from hpcllm.training.settings import data_settings, param_text

    return param_text(data_settings(EXPERIMENTS[wildcards.experiment]))


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


def segment_slurm_extra(wildcards):
    """Slurm signals the job steps (srun -> torchrun -> the engine) before the time limit."""
    seconds = EXPERIMENTS[wildcards.experiment].experiment["time"]["signal_seconds"]
    return f"--ntasks-per-node=1 --signal=TERM@{seconds}{threads_per_core_flag()}"


def threads_per_core_flag():
    """Cores, not hardware threads, where the site's Slurm counts those as CPUs (JSC)."""
    return " --threads-per-core=1" if CLUSTER.threads_per_core > 1 else ""


# ---- benchmarks (the globals these use are set in benchmarks.smk)


def bench_ids(benchmark):
    return [i for i, p in BENCH_POINTS.items() if p["benchmark"] == benchmark]


def bench_point(wildcards):
    return BENCH_POINTS[wildcards.point]


def bench_container(benchmark, check=False):
    """The point's image (None without); ``check``: as an input, stop the plan when it
    can be neither found nor built (container_image)."""
    purpose = "train" if benchmark == "language" else "vision"
    images = container_image(purpose, check)
    return images[0] if images else None


def bench_vision_inputs(wildcards):
    point = BENCH_POINTS[wildcards.point]
    inputs = {"lmdb": f"data/vision/{point['dataset']}/{point['split']}.lmdb"}
    if point.get("val_split"):
        inputs["val"] = f"data/vision/{point['dataset']}/{point['val_split']}.lmdb"
    if bench_container("vision"):
        inputs["container"] = bench_container("vision", check=True)
    return inputs


def bench_language_inputs(wildcards):
    point = BENCH_POINTS[wildcards.point]
    inputs = {}
    if point["data"] != "mock":
        inputs["data"] = [point["data"] + ".bin", point["data"] + ".idx"]
    if point.get("tokenizer"):
        inputs["tokenizer"] = point["tokenizer"]
    if bench_container("language"):
        inputs["container"] = bench_container("language", check=True)
    return inputs


def bench_nodes(wildcards):
    return BENCH_POINTS[wildcards.point]["nodes"] if CLUSTER.uses_slurm else 1


def bench_threads(wildcards):
    """Slurm: the whole node for the launcher; here: one core per process of the run."""
    point = BENCH_POINTS[wildcards.point]
    return CLUSTER.cpus_per_node if CLUSTER.uses_slurm else point["gpus"]


def bench_gres(wildcards):
    return f"gpu:{CLUSTER.gpus_per_node}" if CLUSTER.gpus_per_node else ""


def bench_runtime_min(point):
    """A language point's time limit sized from its work; 120 min for a vision point."""
    work = point_time_limit(point, facts_of(CLUSTER))
    return work.limit_minutes if work else 120


def bench_runtime(wildcards):
    return bench_runtime_min(BENCH_POINTS[wildcards.point])


def bench_time_limit_s(wildcards, resources):
    return resources.runtime * 60 * BENCH["run_time_limit_fraction"]


def bench_records():
    return [
        f"results/bench/{p['benchmark']}/{i}/run.json" for i, p in BENCH_POINTS.items()
    ]


def page_experiment_names():
    """The experiments the default target trains (see all_targets): on a GPU cluster
    the laptop's torch-engine examples only when named in `training.run`."""
    names = TRAINING.get("run") or list(EXPERIMENTS)
    if CLUSTER.uses_slurm and CLUSTER.gpus_per_node and not TRAINING.get("run"):
        names = [n for n in names if EXPERIMENTS[n].experiment["engine"] != "torch"]
    return names


def results_page_target():
    if not BENCH_POINTS and not page_experiment_names():
        return []
    return ["results/index.html"]


def results_page_inputs(wildcards):
    """The results page reads the benchmark summary and plots, and per experiment its
    loss curve and every segment's record (named keys for the script)."""
    inputs = {}
    if BENCH_POINTS:
        inputs["summary"] = "results/bench/summary.csv"
        for name in BENCH_PLOTS:
            inputs[f"plot_{name}"] = f"results/bench/plots/{name}.png"
    for name in page_experiment_names():
        inputs[f"loss_{name}"] = f"results/train/{name}/loss.png"
        segments = EXPERIMENTS[name].experiment["segments"]
        inputs[f"records_{name}"] = [
            f"results/train/{name}/seg{k}.json" for k in range(1, segments + 1)
        ]
    return inputs


def results_page_experiments(wildcards):
    return {name: EXPERIMENTS[name] for name in page_experiment_names()}


def benchmark_targets():
    if not BENCH_POINTS:
        return []
    return ["results/bench/summary.csv"] + [
        f"results/bench/plots/{name}.png" for name in BENCH_PLOTS
    ]
