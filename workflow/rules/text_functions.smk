# The text stage's globals, plan-time checks and input/params functions (its rules:
# text.smk, which includes this file first).
# A missing input file is reported here, at plan time (dry run included).
# The laptop examples' sample data where they are not (a project folder that uses the
# workflow as a module, run with profiles/local): the message says what to run instead.
from hpcllm.text.source_keys import examples_data_hint
from hpcllm.text.sources import SourceError

for _name, _source in SOURCES.items():
    if _source["type"] == "local":
        try:
            resolve_local_files(_name, _source)
        except SourceError as e:
            _hint = examples_data_hint(CONFIG_FILES, _name, HPCLLM_ROOT)
            if not _hint:
                raise
            raise SourceError(f"{e}{_hint}") from None
if SOURCES and not TOKENIZE["tokenizers"]:
    raise ValueError(
        f"text.sources has {', '.join(SOURCES)} but text.tokenize.tokenizers names no "
        f"tokenizer to tokenize them with: add one of text.tokenizers "
        f"({', '.join(TOKENIZERS) or 'none defined yet: define one'}) to it"
    )
for _name in TOKENIZE["tokenizers"]:
    if _name not in TOKENIZERS:
        raise ValueError(
            f"text.tokenize.tokenizers names '{_name}', which is not in text.tokenizers "
            f"({', '.join(TOKENIZERS) or 'none defined'})"
        )
from hpcllm.text.tokenizers_config import missing_file_problem

# A given tokenizer's file that is not there, a tokenizer without its end-of-document
# token, or whose given files cannot be loaded (by the controller only: it loads a given
# tokenizer.json, which jobs need not repeat).
if workflow.is_main_process:
    for _name in TOKENIZE["tokenizers"]:
        _problem = missing_file_problem(
            _name, TOKENIZERS[_name]
        ) or tokenizer_plan_problem(_name, TOKENIZERS[_name])
        if _problem:
            raise ValueError(_problem)


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


from hpcllm.job_arguments import job_argument

TOKENIZE_JOB = package_module("hpcllm.text.tokenize_job")


def source_read_argument(wildcards):
    return job_argument(
        read_config(wildcards.source), f"text.sources.{wildcards.source}"
    )


def tokenizer_use_argument(wildcards):
    return job_argument(tokenizer_use(wildcards), f"text.tokenizers.{wildcards.tok}")


# Given (type: files) tokenizers: rule tokenizer_folder's (a tokenizer.json, or GPT-2 files).
GIVEN_TOKENIZERS = (
    "|".join(n for n, t in TOKENIZERS.items() if t["type"] == "files") or "NONE"
)


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
    threads = min(threads, CLUSTER.cpus_per_node) if CLUSTER.uses_slurm else threads
    note_dry_run_threads("tokenize_batch", threads)
    return threads


def batch_mem_mb(wildcards, threads):
    """1 GB per thread of the batch as submitted. Not from ``threads`` on a cluster: a
    dry run caps every job's threads at its --cores (1 unless given, Snakemake's
    default for -n), a Slurm run does not, so the dry run would show 1 GB."""
    return 1000 * (batch_threads(wildcards) if CLUSTER.uses_slurm else threads)


_THREADS_NOTED = set()


def note_dry_run_threads(rule_name, threads):
    """Say once per rule where a dry run of a Slurm profile shows fewer threads than the
    jobs are submitted with (Snakemake caps threads at -n's --cores, 1 by default)."""
    if not (workflow.is_main_process and workflow.dryrun and CLUSTER.uses_slurm):
        return
    cores = workflow.resource_settings.cores
    if rule_name in _THREADS_NOTED or not isinstance(cores, int) or threads <= cores:
        return
    _THREADS_NOTED.add(rule_name)
    logger.info(
        f"{rule_name}: jobs are submitted with {threads} threads (--cpus-per-task) and "
        f"{1000 * threads} MB; this dry run shows "
        f"threads: {cores}, Snakemake's cap for -n without --cores "
        f"(-n --cores {threads} shows them as submitted)."
    )


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
