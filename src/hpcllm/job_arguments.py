"""Configs as command-line arguments of a job that runs a package module from ``shell:``."""

from __future__ import annotations

import json
import shlex
from typing import Any

# Snakemake runs a shell: job as `bash -c "<command>"`: one argument, which Linux caps at
# 128 KiB (MAX_ARG_STRLEN, include/uapi/linux/binfmts.h). A config argument stays well
# below it, so that the command's paths and other arguments fit beside it.
MAX_ARGUMENT_CHARS = 32 * 1024


class JobArgumentError(ValueError):
    """A config too large to pass on a job's command line."""


class JobArgument(dict):
    """A config as a rule's param: the dict itself where Snakemake records params to
    decide a rerun (its ``repr``: the record the ``script:`` rule wrote, so a param is
    never a reason to redo a shard), compact JSON where the shell command formats it."""

    def __format__(self, spec: str) -> str:
        return format(json.dumps(self, sort_keys=True, separators=(",", ":")), spec)

    def __str__(self) -> str:
        return self.__format__("")


def job_argument(value: dict[str, Any], key: str = "") -> JobArgument:
    """``value`` as a param that a shell command passes as one JSON argument; refused,
    naming ``key``, where it would not fit on a command line."""
    argument = JobArgument(value)
    if len(str(argument)) > MAX_ARGUMENT_CHARS:
        raise JobArgumentError(
            f"{key or 'a config section'} is {len(str(argument)):,} characters as JSON, more "
            f"than a job's command line takes ({MAX_ARGUMENT_CHARS:,}): name the files with "
            "globs instead of listing them one by one"
        )
    return argument


class PackageModule:
    """``python -m <module>`` of this checkout's package, as a shell: rule's param: the
    checkout's ``src`` first on ``PYTHONPATH`` (an installed copy of the package would
    come after it) and the given Python, both quoted. Not a builtin type, so Snakemake
    does not record it among the params that decide a rerun: a new path of the virtual
    environment or the checkout is no reason to redo a job."""

    def __init__(self, module: str, src: str, python: str) -> None:
        self.module, self.src, self.python = module, src, python

    def __str__(self) -> str:
        path = f"PYTHONPATH={shlex.quote(self.src)}${{PYTHONPATH:+:$PYTHONPATH}}"
        return f"{path} {shlex.quote(self.python)} -m {self.module}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)
