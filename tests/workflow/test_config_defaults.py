"""fill_defaults gives the config Snakemake's validate gives it (a job process uses it)."""

from __future__ import annotations

import copy

import pytest
import yaml
from snakemake.utils import update_config, validate
from support import REPO

from hpcllm.configuration import SECTIONS, ConfigError, fill_defaults

SCHEMAS = REPO / "workflow" / "schemas"
EXAMPLES = REPO / "config" / "examples"
# The --configfile combinations the docs use (each layered over config/config.yaml).
LAYERS = [
    [],
    [EXAMPLES / "local.yaml"],
    [EXAMPLES / "fineweb_juwels.yaml"],
    [EXAMPLES / "fineweb_juwels.yaml", REPO / "config/experiments/opengptx_800m.yaml"],
    [
        EXAMPLES / "fineweb_juwels.yaml",
        REPO / "config/experiments/opengptx_800m.yaml",
        EXAMPLES / "evaluate_800m.yaml",
    ],
    [REPO / "config/experiments/language_sweep.yaml"],
    [REPO / "config/experiments/vision_sweep.yaml"],
]


def with_defaults(config: dict, fill) -> dict:
    """The steps of common.smk: the top level, then each section from its own schema."""
    config = copy.deepcopy(config)
    fill("", config, SCHEMAS / "config.schema.yaml")
    for section in SECTIONS:
        config.setdefault(section, {})
        fill(section, config[section], SCHEMAS / f"{section}.schema.yaml")
    return config


def snakemake_validate(section, data, schema):
    validate(data, str(schema))


@pytest.mark.parametrize(
    "configfiles", LAYERS, ids=lambda ps: "+".join(p.stem for p in ps) or "built-in"
)
def test_the_defaults_are_the_ones_snakemakes_validate_sets(configfiles):
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    for path in configfiles:
        update_config(config, yaml.safe_load(path.read_text()))
    ours = with_defaults(config, fill_defaults)
    assert ours == with_defaults(config, snakemake_validate)
    assert ours != config  # defaults were set: the comparison compares something


def test_a_value_the_schema_refuses_is_named_by_its_key():
    with pytest.raises(ConfigError, match=r"config key text\.on_bad_record: 'maybe'"):
        fill_defaults("text", {"on_bad_record": "maybe"}, SCHEMAS / "text.schema.yaml")
