"""Config validation messages that name the key, and config/README.md from the schemas."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

SECTIONS = ("text", "vision", "containers", "training", "benchmarks")


class ConfigError(ValueError):
    """A config value that does not match its schema; names every offending key."""


@cache
def _load_schema(path: str) -> Any:
    # libyaml's loader where PyYAML has it: about 10x the pure-Python one on these files,
    # which every job process parses again with the Snakefile (issue 33 item 11).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(Path(path).read_text(), Loader=loader)


def load_schema(path: str | Path) -> Any:
    """A schema file's content, parsed once per process (callers must not change it)."""
    return _load_schema(str(Path(path).resolve()))


def key_path(section: str, path) -> str:
    return ".".join([p for p in [section, *map(str, path)] if p]) or "(top level)"


def unset_nulls(section: str, data: Any, schema_path: str | Path) -> list[str]:
    """Remove each key whose value is null where its schema does not allow null, and return
    their names. Snakemake merges a --configfile over config/config.yaml key by key, so
    `mirror: null` is the one way a user's file can remove a key set before it; where null
    is a value of its own (benchmarks' val_split: null, no validation split) it stays."""
    import jsonschema

    if not isinstance(data, dict):
        return []
    validator = jsonschema.Draft202012Validator(load_schema(schema_path))
    removed: list[str] = []
    while True:
        paths = {
            tuple(e.absolute_path)
            for e in validator.iter_errors(data)
            if e.instance is None and e.absolute_path
        }
        if not paths:
            return removed
        for path in sorted(paths, key=len):
            parent = data
            for key in path[:-1]:
                parent = parent.get(key) if isinstance(parent, dict) else None
            if isinstance(parent, dict) and parent.get(path[-1], 0) is None:
                del parent[path[-1]]
                removed.append(key_path(section, path))


def check_section(section: str, data: Any, schema_path: str | Path) -> None:
    """Raise ``ConfigError`` listing ``config key text.on_bad_record: 'maybe' is not one
    of ['fail', 'skip']`` for each error (Snakemake's own message names no section)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(load_schema(schema_path))
    errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        lines = [
            f"config key {key_path(section, e.absolute_path)}: {e.message}" for e in errors[:10]
        ]
        raise ConfigError(
            "\n".join(lines)
            + "\n(each key is described in config/README.md"
            + (f", section {section})" if section else ")")
        )


def fill_defaults(section: str, data: Any, schema_path: str | Path) -> None:
    """Set every absent key that has a default in its schema, as Snakemake's
    ``validate(data, schema)`` does (the same jsonschema extension), and raise
    ``ConfigError`` naming each key where ``data`` does not match. The schema comes from
    ``load_schema`` (parsed once, with libyaml): Snakemake's ``validate`` parses it with
    PyYAML's pure-Python loader on every call, in every job process (issue 51 item 11)."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    check_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if validator.is_type(instance, "object"):
            for name, subschema in properties.items():
                if "default" in subschema:
                    instance.setdefault(name, subschema["default"])
        yield from check_properties(validator, properties, instance, schema)

    filler = jsonschema.validators.extend(base, {"properties": set_defaults})
    try:
        filler(load_schema(schema_path)).validate(data)
    except jsonschema.ValidationError:
        check_section(section, data, schema_path)
        raise


def _describe(name: str, schema: dict[str, Any], defs: dict[str, Any], depth: int, out: list[str]):
    if "$ref" in schema and schema["$ref"].startswith("#/$defs/"):
        schema = defs[schema["$ref"].removeprefix("#/$defs/")]
    kind = schema.get("type") or (
        "one of " + ", ".join(map(str, schema["enum"])) if "enum" in schema else ""
    )
    if isinstance(kind, list):
        kind = " or ".join(kind)
    desc = " ".join(str(schema.get("description", "")).split())
    default = (
        f" Default: `{schema['default']!r}`."
        if "default" in schema and schema["default"] != {}
        else ""
    )
    out.append(f"{'  ' * depth}- `{name}` ({kind}): {desc}{default}".replace(" ()", ""))
    for key, sub in schema.get("properties", {}).items():
        _describe(key, sub, defs, depth + 1, out)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and extra:
        _describe("<name>", extra, defs, depth + 1, out)
    if isinstance(schema.get("items"), dict) and "properties" in schema["items"]:
        _describe("[item]", schema["items"], defs, depth + 1, out)


def config_reference(schema_dir: str | Path) -> str:
    """A Markdown reference of every config key, from the schemas' descriptions."""
    schema_dir = Path(schema_dir)
    top = load_schema(schema_dir / "config.schema.yaml")
    out = [
        "# Configuration reference",
        "",
        "Generated from `workflow/schemas/*.schema.yaml` by `python -m hpcllm config-docs`;",
        "a test keeps it in step with the schemas. The built-in configuration is",
        "`config/config.yaml`; pass your own with `--configfile` (it is merged over the",
        "built-in one), or single keys with `--config key=value`.",
        "",
        "## Top level",
        "",
    ]
    for key, sub in top["properties"].items():
        if key not in SECTIONS:
            _describe(key, sub, {}, 0, out)
    for section in SECTIONS:
        schema = load_schema(schema_dir / f"{section}.schema.yaml")
        out += ["", f"## `{section}`", "", " ".join(str(schema.get("description", "")).split()), ""]
        defs = schema.get("$defs", {})
        for key, sub in schema.get("properties", {}).items():
            _describe(key, sub, defs, 0, out)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            _describe("<name>", extra, defs, 0, out)
    return "\n".join(out) + "\n"


def vision_split_errors(
    experiments: dict[str, Any], image_datasets: dict[str, Any], root: str | Path = "."
) -> list[str]:
    """A vision benchmark's ``dataset`` that the vision section does not have, and its
    ``split`` / ``val_split`` that its dataset does not pack, named by key (Snakemake would
    only report a missing ``data/vision/<dataset>/<split>.lmdb``). An experiment given as
    a file path (config/experiments/*.yaml) is read from ``root``."""
    from hpcllm.bench.sweeps import load_experiment

    errors = []
    for name, spec in experiments.items():
        exp = load_experiment(name, spec, root)
        if exp.get("benchmark") != "vision":
            continue
        if exp.get("dataset") not in image_datasets:
            errors.append(
                f"benchmarks.experiments.{name}.dataset"
                + ("" if isinstance(spec, dict) else f" (in {spec})")
                + f": '{exp.get('dataset')}' is not a dataset of the vision section "
                f"(vision.datasets: {', '.join(image_datasets) or 'none'}); name one of "
                "them, or add it under vision.datasets (its root: the folder holding train/ "
                "and val/)"
            )
            continue
        splits = image_datasets[exp["dataset"]].get("splits") or ["train", "val"]
        for key, value in (
            ("split", exp.get("split", "train")),
            ("val_split", exp.get("val_split", "val")),
        ):
            if value is not None and value not in splits:
                errors.append(
                    f"benchmarks.experiments.{name}.{key}: '{value}' is not a split of vision "
                    f"dataset {exp['dataset']} (it packs {', '.join(splits)}; "
                    f"vision.datasets.{exp['dataset']}.splits)"
                )
    return errors


# The checkout's own config/ (src/hpcllm/configuration.py -> the checkout).
SHIPPED_CONFIG = Path(__file__).resolve().parents[2] / "config"


def shipped_configs_setting(*keys: str, root: Path = SHIPPED_CONFIG) -> list[str]:
    """The config files shipped under ``root`` (config/examples, config/experiments) that
    set the key ``keys`` (e.g. text, tokenizers, fineweb_bpe), as config/<...>.yaml; for
    the message of a name that no given config file defines."""
    found = []
    for path in sorted(root.glob("*/*.yaml")):
        if path.parent.name == "clusters":
            continue
        try:
            data = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except (OSError, yaml.YAMLError):
            continue
        for key in keys:
            data = data.get(key) if isinstance(data, dict) else None
        if data is not None:
            found.append(f"config/{path.parent.name}/{path.name}")
    return found


def missing_data_config(experiment: str, section: str, name: str) -> str:
    """What to do about an experiment's tokenizer or source (``section``: text.tokenizers,
    text.sources) that no given config file defines: the shipped data config that defines
    it goes with the experiment's file in one --configfile list, before it."""
    defined = shipped_configs_setting(*section.split("."), name)
    if not defined:
        return f"define it under {section}, or give the config file that does with --configfile"
    # the experiment's own file first (an evaluation config adds keys to it)
    experiment_files = sorted(
        shipped_configs_setting("training", "experiments", experiment),
        key=lambda f: not f.startswith("config/experiments/"),
    )
    files = [*defined[:1], *experiment_files[:1]]
    if len(files) == 1:
        files.append("<your experiment's file>")
    return (
        f"{' and '.join(defined)} {'defines' if len(defined) == 1 else 'define'} it: give "
        f"the data config with the experiment's file in one --configfile list, data first "
        f"(--configfile {' '.join(files)})"
    )
