# Config validation, wildcard constraints and the input/params functions of every rule.
import os
import sys

sys.path.insert(0, os.path.join(workflow.basedir, "src"))  # the package, also uninstalled

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from hpcllm.text_sources import resolve_local_files
from hpcllm.tokenizers_config import tokenizer_files


validate(config, "../schemas/config.schema.yaml")
# Each section has its own schema file; validated one by one so that their defaults are
# filled in (snakemake's validate does not fill defaults behind a $ref to another file).
for _section in ("text", "vision", "containers", "training", "benchmarks"):
    try:
        validate(config.setdefault(_section, {}), f"../schemas/{_section}.schema.yaml")
    except WorkflowError as e:
        raise WorkflowError(
            f"The config section '{_section}' is invalid (see config/README.md and "
            f"workflow/schemas/{_section}.schema.yaml):",
            e,
        )

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


wildcard_constraints:
    source="|".join(SOURCES) or "NONE",
    tok="|".join(TOKENIZERS) or "NONE",
    shard=r"\d{4}",


def shard_ids(source):
    return [f"{i:04d}" for i in range(SOURCES[source]["shards"])]


def raw_shards(source):
    return expand("data/raw/{source}/{shard}.jsonl.zst", source=source, shard=shard_ids(source))


def source_config(wildcards):
    return SOURCES[wildcards.source]


def source_num_shards(wildcards):
    return SOURCES[wildcards.source]["shards"]


def tokenizer_config(wildcards):
    return TOKENIZERS[wildcards.tok]


def tokenizer_training_shards(wildcards):
    cfg = TOKENIZERS[wildcards.tok]
    return [path for source in cfg.get("sources") or SOURCES for path in raw_shards(source)]


def tokenizer_inputs(wildcards):
    return tokenizer_files(wildcards.tok, TOKENIZERS[wildcards.tok])


def tokenized_shard_prefixes(wildcards):
    return [
        f"data/tokenized/{wildcards.tok}/{wildcards.source}/{shard}_text_document"
        for shard in shard_ids(wildcards.source)
    ]


def tokenized_shards(wildcards):
    return [p + ext for p in tokenized_shard_prefixes(wildcards) for ext in (".bin", ".idx")]


def text_targets():
    return expand(
        "data/tokenized/{tok}/{source}_text_document.{ext}",
        tok=TOKENIZE["tokenizers"],
        source=SOURCES,
        ext=("bin", "idx"),
    )


def all_targets(wildcards):
    return text_targets() + vision_targets() + training_targets() + benchmark_targets()
