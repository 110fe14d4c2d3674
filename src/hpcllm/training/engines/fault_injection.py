"""Test-only fault injection for the torch engine: makes one rank hang in its save or
its data loading, or slows its every step, so the watchdog's real tests
(tests/training/test_watchdog_segment.py, tests/slurm/test_hangs.py) meet those faults
through the real code path.

Inert unless ``HPCLLM_TEST_FAULT`` is set (never by the workflow): ``<kind>:<who>:<after>``
with ``kind`` ``save`` (the rank blocks forever inside its save, before rank 0 writes) or
``data`` (it blocks forever in its data loading), each at the first iteration past
``after``; or ``slow:<who>:<after>:<seconds>``: the rank sleeps that long in every step's
compute past ``after`` (a straggler). ``who`` is a rank, or a Slurm node name (every
rank on that node, ``SLURMD_NODENAME``): a fault bound to a node stays behind when the
next job excludes that node, as a faulty node would.
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
    rank: int | None  # None: the fault is bound to ``node``
    after: int
    seconds: float = 0.0
    node: str | None = None  # the Slurm node whose ranks meet the fault
    here: str = ""  # this process's Slurm node

    @classmethod
    def from_environment(cls, environ=os.environ) -> Fault | None:
        text = environ.get(FAULT_ENV)
        if not text:
            return None
        parts = text.split(":")
        try:
            kind, who, after = parts[0], parts[1], int(parts[2])
            seconds = float(parts[3]) if kind == "slow" else 0.0
        except (IndexError, ValueError):
            kind, who = "", ""
        if kind not in KINDS or not who:
            raise ValueError(
                f"{FAULT_ENV}={text!r}: expected save:<rank>:<after>, data:<rank>:<after> "
                "or slow:<rank>:<after>:<seconds> (a Slurm node name for <rank>: every rank "
                "on that node); unset it outside the watchdog's tests"
            )
        rank, node = (int(who), None) if who.isdigit() else (None, who)
        here = environ.get("SLURMD_NODENAME") or ""
        return cls(kind, rank, after, seconds, node, here)

    def hits(self, rank: int) -> bool:
        return self.rank == rank if self.node is None else self.node == self.here


def inject(fault: Fault | None, kind: str, rank: int, iteration: int) -> None:
    """Where the engine would meet a fault of ``kind``: block forever (``save``, ``data``)
    or sleep (``slow``) if the fault names this rank (or its node) and the iteration is
    past its ``after``."""
    if fault is None or fault.kind != kind or not fault.hits(rank) or iteration <= fault.after:
        return
    if kind == "slow":
        threading.Event().wait(fault.seconds)
    else:  # the main thread blocks; the heartbeat thread runs on (alive, no progress)
        threading.Event().wait()
