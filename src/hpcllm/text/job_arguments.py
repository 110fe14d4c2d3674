"""Configs as command-line arguments of a job that runs a package module from ``shell:``."""

from __future__ import annotations

import json
from typing import Any

# Snakemake runs a shell: job as `bash -c "<command>"`: one argument, which Linux caps at
# 128 KiB (MAX_ARG_STRLEN, include/uapi/linux/binfmts.h). A config argument stays well
# below it, so that the command's paths and other arguments fit beside it.
MAX_ARGUMENT_CHARS = 32 * 1024


class JobArgumentError(ValueError):
    """A config too large to pass on a job's command line."""


def job_argument(value: dict[str, Any], key: str = "") -> str:
    """``value`` as one command-line argument: compact JSON, keys sorted so that the
    rule's params (which Snakemake compares to decide a rerun) do not change with the
    config files' key order."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    if len(text) > MAX_ARGUMENT_CHARS:
        raise JobArgumentError(
            f"{key or 'a config section'} is {len(text):,} characters as JSON, more than a "
            f"job's command line takes ({MAX_ARGUMENT_CHARS:,}): name the files with "
            "globs instead of listing them one by one"
        )
    return text
