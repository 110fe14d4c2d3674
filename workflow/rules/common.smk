# Config validation, wildcard constraints and the input/params functions of every rule.
import os
import sys

# The package, importable also where it is not installed.
sys.path.insert(0, os.path.join(workflow.basedir, "src"))

from snakemake.utils import validate

from hpcllm.configuration import SECTIONS, check_section
from hpcllm.text_sources import resolve_local_files
from hpcllm.tokenizers_config import tokenizer_files

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

# The cluster this run targets: config/clusters/<cluster>.yaml (the profile sets
# `cluster`). Site facts left to the user and profile resources that name an unset
# environment variable stop the run here, before anything is submitted.
from snakemake.exceptions import WorkflowError as _WorkflowError

from hpcllm.clusters import ClusterError, load_cluster, plan_errors, profile_errors

_clusters_dir = "config/clusters"
if not os.path.isdir(_clusters_dir):  # a working directory without its own config/
    _clusters_dir = os.path.join(workflow.basedir, "config", "clusters")
try:
    CLUSTER = load_cluster(config["cluster"], root=_clusters_dir)
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
    shard=r"\d{4}",


def shard_ids(source):
    return [f"{i:04d}" for i in range(SOURCES[source]["shards"])]


def raw_shards(source):
    return expand(
        "data/raw/{source}/{shard}.jsonl.zst", source=source, shard=shard_ids(source)
    )


def source_config(wildcards):
    return SOURCES[wildcards.source]


def source_num_shards(wildcards):
    return SOURCES[wildcards.source]["shards"]


def tokenizer_config(wildcards):
    return TOKENIZERS[wildcards.tok]


def tokenizer_training_shards(wildcards):
    cfg = TOKENIZERS[wildcards.tok]
    return [
        path for source in cfg.get("sources") or SOURCES for path in raw_shards(source)
    ]


def tokenizer_inputs(wildcards):
    return tokenizer_files(wildcards.tok, TOKENIZERS[wildcards.tok])


def tokenized_shard_prefixes(wildcards):
    return [
        f"data/tokenized/{wildcards.tok}/{wildcards.source}/{shard}_text_document"
        for shard in shard_ids(wildcards.source)
    ]


def tokenized_shards(wildcards):
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
    return text_targets() + vision_targets() + training_targets() + benchmark_targets()
