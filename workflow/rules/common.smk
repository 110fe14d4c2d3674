# What every stage shares: the config validated, the text sections' names (for the
# wildcard constraints), the cluster, and the default target. Each stage's input and
# params functions stand in its own rule file, above its rules.
import os
import sys
from types import SimpleNamespace

from hpcllm.commandline import read_config_files
from hpcllm.configuration import (
    SECTIONS,
    ConfigError,
    check_section,
    fill_defaults,
    unset_nulls,
)
from hpcllm.text.source_keys import cap_lines, source_key_problems
from hpcllm.text.sources import offline_source_error, resolve_local_files
from hpcllm.text.tokenizers_config import plan_problem as tokenizer_plan_problem
from hpcllm.text.tokenizers_config import retrain_warning, tokenizer_files

# `key: null` in a --configfile removes the key (where null is no value of its own).
_unset = unset_nulls("", config, f"{HPCLLM_ROOT}/workflow/schemas/config.schema.yaml")
for _section in SECTIONS:
    _unset += unset_nulls(
        _section,
        config.get(_section),
        f"{HPCLLM_ROOT}/workflow/schemas/{_section}.schema.yaml",
    )
if _unset and workflow.is_main_process:
    logger.info(f"Unset by null in a config file: {', '.join(_unset)}")
# check_section reports every error by its key, in the controller: a job's config is the
# controller's, already checked (a job's parse is part of every job's fixed cost).
if workflow.is_main_process:
    check_section("", config, f"{HPCLLM_ROOT}/workflow/schemas/config.schema.yaml")
fill_defaults("", config, f"{HPCLLM_ROOT}/workflow/schemas/config.schema.yaml")
# The config files in the order Snakemake merges them (the last one's keys win), for the
# messages that name the file a key came from.
CONFIG_FILES = (
    read_config_files(["config/config.yaml", *workflow.overwrite_configfiles])
    if workflow.is_main_process
    else []
)
# Each section has its own schema file; fill_defaults fills in its defaults as Snakemake's
# validate would, with the schema parsed once by libyaml (a job process parses this again).
for _section in SECTIONS:
    config.setdefault(_section, {})
    if workflow.is_main_process:
        check_section(
            _section,
            config[_section],
            f"{HPCLLM_ROOT}/workflow/schemas/{_section}.schema.yaml",
        )
        # Keys a source's type does not read (inherited from a source of the same name in
        # an earlier config file); before fill_defaults sets the defaults of both types.
        if _section == "text":
            _problems = source_key_problems(
                config["text"].get("sources", {}), CONFIG_FILES
            )
            if _problems:
                raise ConfigError("\n".join(_problems))
    fill_defaults(
        _section,
        config[_section],
        f"{HPCLLM_ROOT}/workflow/schemas/{_section}.schema.yaml",
    )

TEXT = config["text"]
SOURCES = TEXT["sources"]
# A cap on a source's documents is said in the plan: one inherited from another config
# file (a source of the same name) tokenized 200 of a user's 2,000 documents unseen.
if workflow.is_main_process:
    for _line in cap_lines(SOURCES, CONFIG_FILES):
        logger.info(_line)
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

# The cluster this run targets: config/clusters/<cluster>.yaml (the profile sets
# `cluster`). Site facts left to the user and profile resources that name an unset
# environment variable stop the run here, before anything is submitted.
from snakemake.exceptions import WorkflowError as _WorkflowError

from hpcllm.clusters import (
    ClusterError,
    check_configfile_cluster,
    cluster_from_profile,
    load_cluster,
    plan_errors,
    profile_cluster,
    profile_errors,
)
from hpcllm.plan_cost import (
    MAX_GPU_HOURS_KEY,
    HangRisk,
    TrainingEstimate,
    cost_per_rule,
    describe_cpu_only,
    describe_hang_risk,
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
    _clusters_dir = os.path.join(HPCLLM_ROOT, "config", "clusters")
try:
    CLUSTER = load_cluster(config["cluster"], root=_clusters_dir)
    # A --config on the command line replaces the profile's config: (cluster included):
    # the cluster is read from the profile itself (hpcllm.clusters.profile_cluster).
    _roots = [os.getcwd(), os.environ.get("PWD", ".")]
    _profile = profile_cluster(sys.argv, roots=_roots)
    # A --configfile naming another cluster than the profile's would be ignored silently.
    check_configfile_cluster(workflow.overwrite_configfiles, _profile, roots=_roots)
    _cluster_name, _note = cluster_from_profile(config["cluster"], _profile)
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


def package_module(name):
    """A shell: rule's ``python -m <name>`` (hpcllm.job_arguments.PackageModule): the
    checkout's package first on the path, and the Python Snakemake gives a script: job
    (the environment's under --software-deployment-method conda, else this process's).
    A job that runs a module instead of a script: spares Snakemake's script machinery
    (about 0.2 CPU-s a job: docs/measurements/text.md)."""
    from snakemake.settings.types import DeploymentMethod

    from hpcllm.job_arguments import PackageModule

    in_conda = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
    return PackageModule(
        name, os.path.join(HPCLLM_ROOT, "src"), "python" if in_conda else sys.executable
    )


wildcard_constraints:
    source="|".join(SOURCES) or "NONE",
    tok="|".join(TOKENIZERS) or "NONE",
    shard=r"\d{4}\d*",
    batch=r"\d{4}\d*",


def all_targets(wildcards):
    """The default target. On a GPU cluster: what a user runs there (text data, real
    image datasets, training on the megatron engine, benchmark points the config asks
    for); the built-in laptop examples (the torch-engine tiny_local, the generated image
    samples) run there only when named (`training.run`, or as a target). Elsewhere (a
    laptop, a CPU-only cluster such as the test cluster) everything configured. Each
    trained experiment ends with its Hugging Face export (docs/export.md) and, where it
    has an `evaluate` key, its scores (docs/evaluation.md)."""
    if not (SOURCES or vision_targets() or EXPERIMENTS or BENCH_POINTS):
        logger.warning(
            "Nothing is configured to run: config/config.yaml and the --configfile files "
            "name no text sources, image datasets, training experiments or benchmarks. "
            "Add yours (docs/first-project.md), or run the laptop examples: "
            "--configfile config/examples/local.yaml"
        )
    if not (CLUSTER.uses_slurm and CLUSTER.gpus_per_node):
        training = training_targets()
        return (
            text_targets()
            + vision_targets()
            + training
            + export_targets(training)
            + evaluation_targets()
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
    return (
        text_targets()
        + vision
        + training
        + export_targets(training)
        + evaluation_targets()
        + benchmark_targets()
        + results_page_target()
    )
