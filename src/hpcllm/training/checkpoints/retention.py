"""Retention: the checkpoints ``keep_checkpoints`` does not keep are deleted while the
engine runs and after it (:func:`hpcllm.training.checkpoints.tracker.prune` says what is
safe)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from hpcllm.training.checkpoints import tracker as checkpoints

log = logging.getLogger(__name__)


def retention(experiment: dict[str, Any], save: str) -> Callable[[], None]:
    """Deletes the checkpoints ``keep_checkpoints`` does not keep (nothing when unset);
    called while the engine runs and after it (checkpoints.prune says what is safe)."""
    keep = experiment.get("keep_checkpoints")

    def prune() -> None:
        if keep:
            deleted = checkpoints.prune(save, keep["last"], keep.get("every"))
            if deleted:
                log.info("keep_checkpoints: deleted iterations %s of %s", deleted, save)

    return prune
