"""A text source's keys are checked against its type at plan time, and its caps are said in
the plan (issue 40 item 8): a user's local source named `fineweb` beside the examples
inherited the example hub source's dataset, mirror and max_documents (Snakemake merges
config files key by key), tokenized 200 of its 2,000 documents and recorded
HuggingFaceFW/fineweb in its manifest."""

from __future__ import annotations

import yaml
from support import REPO

from hpcllm.configuration import load_schema
from hpcllm.text.source_keys import (
    COMMON_KEYS,
    TYPE_KEYS,
    cap_lines,
    source_key_problems,
)

EXAMPLES = "config/examples/local.yaml"


def merged_files(mine: dict) -> tuple[dict, list]:
    """The sources as Snakemake merges config.yaml, the examples and my.yaml, and the files."""
    files = [
        (str(p), yaml.safe_load((REPO / p).read_text())) for p in ("config/config.yaml", EXAMPLES)
    ]
    files.append(("my.yaml", mine))
    sources: dict = {}
    for _, data in files:
        for name, cfg in ((data or {}).get("text") or {}).get("sources", {}).items():
            sources[name] = {**sources.get(name, {}), **cfg}
    return sources, files


def test_a_local_source_named_as_an_example_hub_source_is_refused_naming_what_it_inherited():
    mine = {"text": {"sources": {"fineweb": {"type": "local", "files": "mine/*.jsonl"}}}}
    sources, files = merged_files(mine)
    assert sources["fineweb"]["max_documents"] == 200  # what the user did not write
    assert source_key_problems(sources, files) == [
        "text.sources.fineweb is type: local (in my.yaml), but it has dataset, mirror, name, "
        "keys of a hub source that a local source does not read. They come from "
        "config/examples/local.yaml, where a hub source is also named fineweb: Snakemake "
        "merges config files key by key, so yours inherited its keys (with them "
        "max_documents: 200, shards: 2). Give your source a name of its own, or remove "
        "these keys (`dataset: null` in your file removes a key an earlier file sets)."
    ]
    # A name of its own: nothing to say, and the examples' fineweb keeps its keys.
    own = {"text": {"sources": {"mine": {"type": "local", "files": "mine/*.jsonl"}}}}
    assert source_key_problems(*merged_files(own)) == []


def test_keys_of_the_other_type_in_the_same_file_are_refused():
    cfg = {"type": "hub", "dataset": "HuggingFaceFW/fineweb", "files": "x.jsonl"}
    files = [("my.yaml", {"text": {"sources": {"web": cfg}}})]
    assert source_key_problems({"web": cfg}, files) == [
        "text.sources.web is type: hub (in my.yaml), but it has files, a key of a local "
        "source that a hub source does not read: remove it, or set the type that reads it "
        "(local). Where it belongs to another source, give that source a name of its own."
    ]
    # Keys every type reads, and a source checked without its files (--config).
    both = {"type": "local", "files": "a", "shards": 2, "max_documents": 5, "text_field": "t"}
    assert source_key_problems({"a": both}) == []
    assert source_key_problems(
        {"b": {"type": "local", "files": "a", "sample_by": "line", "mirror": "m", "revision": "v1"}}
    ) == [  # fmt: skip
        "text.sources.b is type: local, but it has mirror, revision, keys of a hub source "
        "that a local source does not read: remove them, or set the type that reads them "
        "(hub). Where they belong to another source, give that source a name of its own."
    ]


def test_the_key_lists_cover_the_schemas_source_keys_once():
    schema = load_schema(REPO / "workflow/schemas/text.schema.yaml")
    keys = set(schema["$defs"]["source"]["properties"])
    assert COMMON_KEYS | TYPE_KEYS["hub"] | TYPE_KEYS["local"] == keys
    assert not (COMMON_KEYS & TYPE_KEYS["hub"] or COMMON_KEYS & TYPE_KEYS["local"])
    assert not TYPE_KEYS["hub"] & TYPE_KEYS["local"]
    assert set(TYPE_KEYS) == set(schema["$defs"]["source"]["properties"]["type"]["enum"])


def test_every_shipped_config_passes():
    for path in sorted((REPO / "config").rglob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        sources = (
            ((data or {}).get("text") or {}).get("sources") if isinstance(data, dict) else None
        )
        if sources:
            assert source_key_problems(sources) == [], path


def test_a_cap_on_documents_is_said_with_the_file_it_comes_from():
    mine = {"text": {"sources": {"mine": {"type": "local", "files": "m", "max_bytes": 10**6}}}}
    sources, files = merged_files(mine)
    assert cap_lines(sources, files) == [
        "text.sources.fineweb reads at most 200 documents (max_documents, set in "
        "config/examples/local.yaml), split evenly over its 2 shards.",
        "text.sources.mine reads at most 1,000,000 bytes of text (max_bytes, set in my.yaml).",
    ]
    assert cap_lines({"x": {"type": "local", "files": "a", "shards": 1}}) == []
