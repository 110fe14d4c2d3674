"""The Hugging Face offline variables of every compute job, in a module of their own: each
job script's first import, so it imports nothing else (a job's start is paid per job)."""

from __future__ import annotations

import os

# Every compute job runs without the Hugging Face hub: a stray lookup (a tokenizer's
# configuration, a dataset script) then fails at once with a clear error instead of after
# minutes of network timeouts on nodes without internet. Only the login-node download
# rules reach the hub. Part of every cluster's job environment (a cluster file's `env`
# may override one); CPU jobs set them with ``go_offline``.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def go_offline(environ: dict | None = None) -> None:
    """Set the Hugging Face offline variables (``OFFLINE_ENV``) in this process: the first
    thing a compute job's script does (never a login-node download rule's)."""
    (os.environ if environ is None else environ).update(OFFLINE_ENV)
