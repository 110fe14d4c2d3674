"""Test-only fault injection for the torch engine: makes one rank hang in its save or
its data loading, or slows its every step, so the watchdog's real tests
(tests/training/test_watchdog_segment.py) meet those faults through the real code path.

Inert unless ``HPCLLM_TEST_FAULT`` is set (never by the workflow): ``<kind>:<rank>:<after>``
with ``kind`` ``save`` (the rank blocks forever inside its save, before rank 0 writes) or
``data`` (it blocks forever in its data loading), each at the first iteration past
``after``; or ``slow:<rank>:<after>:<seconds>``: the rank sleeps that long in every step's
compute past ``after`` (a straggler).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

FAULT_ENV = "HPCLLM_TEST_FAULT"
KINDS = ("save", "data", "slow")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    after: int
    seconds: float = 0.0

    @classmethod
    def from_environment(cls, environ=os.environ) -> Fault | None:
        text = environ.get(FAULT_ENV)
        if not text:
            return None
        parts = text.split(":")
        try:
            kind, rank, after = parts[0], int(parts[1]), int(parts[2])
            seconds = float(parts[3]) if kind == "slow" else 0.0
        except (IndexError, ValueError):
            kind = ""
        if kind not in KINDS:
            raise ValueError(
                f"{FAULT_ENV}={text!r}: expected save:<rank>:<after>, data:<rank>:<after> "
                "or slow:<rank>:<after>:<seconds>; unset it outside the watchdog's tests"
            )
        return cls(kind, rank, after, seconds)


def inject(fault: Fault | None, kind: str, rank: int, iteration: int) -> None:
    """Where the engine would meet a fault of ``kind``: block forever (``save``, ``data``)
    or sleep (``slow``) if the fault names this rank and the iteration is past its ``after``."""
    if fault is None or fault.kind != kind or fault.rank != rank or iteration <= fault.after:
        return
    if kind == "slow":
        threading.Event().wait(fault.seconds)
    else:  # the main thread blocks; the heartbeat thread runs on (alive, no progress)
        threading.Event().wait()
