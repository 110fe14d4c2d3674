"""Plan-time checks of a text source's keys against its type, and its caps stated.

Snakemake merges config files key by key, so a source of a user's --configfile named as one
of an earlier file (``fineweb`` of config/examples/local.yaml) inherits that source's keys:
a local source with the example's ``dataset``, ``mirror`` and ``max_documents``, which
silently capped it at the example's 200 documents and put the example's dataset in its
manifest. The schema allows every key on every source (one ``$defs/source``), and
jsonschema's messages for per-type key sets name no type, so the check is here, with the
file each key came from.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

# Keys of text.sources.<name> by the type that reads them (workflow/schemas/text.schema.yaml,
# $defs/source; tests/text/test_source_keys.py keeps the two in step).
COMMON_KEYS = frozenset(
    {"type", "text_field", "id_field", "shards", "max_documents", "max_bytes",
     "on_bad_record", "max_document_bytes", "min_documents"}
)  # fmt: skip
TYPE_KEYS = {
    "hub": frozenset({"dataset", "name", "split", "data_dir", "revision", "data_files", "mirror"}),
    "local": frozenset({"files", "format", "sample_by"}),
}


def _source_in(data: Any, name: str) -> dict:
    """text.sources.<name> of one config file's content, {} where it has none."""
    for key in ("text", "sources", name):
        data = data.get(key) if isinstance(data, dict) else None
    return data if isinstance(data, dict) else {}


def origin(files: Sequence[tuple[str, Any]], name: str, key: str) -> str | None:
    """The config file whose text.sources.<name>.<key> counts (the last that sets it; files
    in the order Snakemake merges them), None where no file does (--config)."""
    found = [path for path, data in files if key in _source_in(data, name)]
    return found[-1] if found else None


def _listed(keys: Sequence[str]) -> str:
    return ", ".join(keys)


def source_key_problems(
    sources: dict[str, Any], files: Sequence[tuple[str, Any]] = ()
) -> list[str]:
    """For each source with keys its type does not read: the source, the keys, their type,
    the file they came from, and what to do. ``files``: (path, content) of the config files
    in merge order. Run before the schema's defaults are filled in (split: train would be
    set on every local source)."""
    problems = []
    for name, cfg in sources.items():
        kind = cfg.get("type") if isinstance(cfg, dict) else None
        if kind not in TYPE_KEYS:
            continue  # the schema names a missing or unknown type
        foreign = sorted(k for k in cfg if k not in COMMON_KEYS | TYPE_KEYS[kind])
        if not foreign:
            continue
        others = sorted({t for k in foreign for t, keys in TYPE_KEYS.items() if k in keys})
        one = len(foreign) == 1
        type_file = origin(files, name, "type")
        head = (
            f"text.sources.{name} is type: {kind}"
            + (f" (in {type_file})" if type_file else "")
            + f", but it has {_listed(foreign)}, "
            + ("a key" if one else "keys")
            + f" of {' or '.join(f'a {t} source' for t in others)} that a {kind} source "
            "does not read"
        )
        from_files = sorted({f for k in foreign if (f := origin(files, name, k))})
        inherited = [f for f in from_files if f != type_file]
        if inherited:
            # Set by another file than the one that gives the type: a source of the same
            # name there, whose other keys this one has inherited too.
            there = {_source_in(d, name).get("type") for p, d in files if p in inherited}
            there_kind = " or ".join(sorted(str(t) for t in there if t))
            also = sorted(
                f"{k}: {cfg[k]}"
                for k in COMMON_KEYS - {"type"}
                if k in cfg and origin(files, name, k) in inherited
            )
            problems.append(
                f"{head}. {'It comes' if one else 'They come'} from {_listed(inherited)}, "
                f"where a {there_kind + ' ' if there_kind else ''}source is also named "
                f"{name}: Snakemake merges config files key by key, so yours inherited its "
                "keys" + (f" (with them {_listed(also)})" if also else "") + ". Give your "
                "source a name of its own, or remove "
                + ("that key" if one else "these keys")
                + f" (`{foreign[0]}: null` in your file removes a key an earlier file sets)."
            )
        else:
            problems.append(
                f"{head}"
                + (
                    f" (set in {_listed(from_files)})"
                    if from_files and from_files != [type_file]
                    else ""
                )
                + f": remove {'it' if one else 'them'}, or set the type that reads "
                f"{'it' if one else 'them'} ({' or '.join(others)}). Where "
                f"{'it belongs' if one else 'they belong'} to another source, give that "
                "source a name of its own."
            )
    return problems


def cap_lines(sources: dict[str, Any], files: Sequence[tuple[str, Any]] = ()) -> list[str]:
    """A line for each source whose documents or bytes are capped (max_documents,
    max_bytes), for the plan: a cap inherited from another config file is otherwise
    unseen until the manifests' counts."""
    lines = []
    for name, cfg in sources.items():
        if not isinstance(cfg, dict):
            continue
        caps = [
            f"at most {cfg[key]:,} {unit} ({key}"
            + (f", set in {where}" if (where := origin(files, name, key)) else "")
            + ")"
            for key, unit in (("max_documents", "documents"), ("max_bytes", "bytes of text"))
            if cfg.get(key) is not None
        ]
        if caps:
            shards = cfg.get("shards", 1)
            lines.append(
                f"text.sources.{name} reads {' and '.join(caps)}"
                + (f", split evenly over its {shards} shards" if shards > 1 else "")
                + "."
            )
    return lines


def examples_data_hint(files: Sequence[tuple[str, Any]], name: str, root: str) -> str:
    """For a local source whose files are missing: where they are named by the laptop
    examples (``root``/config/examples/local.yaml, the configfile of profiles/local), that
    their data are in the checkout ``root``, and how to run one's own config instead (a
    project folder that uses the workflow as a module); "" otherwise."""
    where = origin(files, name, "files")
    examples = os.path.join(root, "config", "examples", "local.yaml")
    if where is None or not os.path.exists(where) or not os.path.samefile(where, examples):
        return ""
    profile = os.path.join(root, "profiles", "local")
    return (
        f". It is the laptop examples' sample data, named by {os.path.normpath(examples)} "
        f"(the configfile of {profile}) and shipped in that checkout, not in this folder. "
        "To run your own config here, give it with --configfile, which replaces the "
        f"profile's: snakemake --profile {profile} --configfile config/config.yaml"
    )
