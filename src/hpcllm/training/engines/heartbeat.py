"""Per-rank heartbeat files: what each rank of an engine is doing, for the segment's
watchdog (:mod:`hpcllm.training.campaign.watchdog`).

One small JSON file per rank, ``rank<r>.json`` in the folder the segment names in
``HPCLLM_HEARTBEAT_DIR`` (on the shared file system, beside the engine log): rank, host
(Slurm's node name in a Slurm step), pid, phase (``start``, ``data``, ``step``, ``sync``,
``eval``, ``save``), iteration, a progress count, when the phase began, when the file was
written and, once it trained, its compute time per iteration (:meth:`Heartbeat.compute`). The engine calls
:meth:`Heartbeat.progress` at each phase change (every iteration, around data loading
and saves); a thread rewrites the file every ``HPCLLM_HEARTBEAT_SECONDS`` with the same
progress and a new time. So the watchdog tells a rank that is alive but waits (in a
collective, for a peer: its time moves, its progress not) from one that stopped (frozen,
dead, its node gone: the file is no longer written at all). Written atomically (a
temporary file renamed), so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

DIR_ENV = "HPCLLM_HEARTBEAT_DIR"
SECONDS_ENV = "HPCLLM_HEARTBEAT_SECONDS"
PHASES = ("start", "data", "step", "sync", "eval", "save")


def heartbeat_file(folder: str | os.PathLike, rank: int) -> Path:
    return Path(folder) / f"rank{rank}.json"


class Heartbeat:
    """One rank's heartbeat file; nothing at all when ``folder`` is None (no watchdog)."""

    def __init__(
        self, folder: str | os.PathLike | None, rank: int, every: float = 10.0, host: str = ""
    ):
        self.path = heartbeat_file(folder, rank) if folder else None
        self.state: dict[str, Any] = {
            "rank": rank,
            "host": host or socket.gethostname(),
            "pid": os.getpid(),
            "phase": "start",
            "iteration": 0,
            "progress": 0,
            "since": time.time(),
        }
        self.every = every
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_environment(cls, rank: int, environ=os.environ) -> Heartbeat:
        every = float(environ.get(SECONDS_ENV) or 10)
        # Slurm's name of the node (what --exclude takes; two test-cluster nodes share
        # one host), the host name outside a Slurm step
        node = environ.get("SLURMD_NODENAME") or ""
        return cls(environ.get(DIR_ENV) or None, rank, every, node)

    def start(self) -> Heartbeat:
        """Write the first beat and start the thread that keeps the file's time fresh."""
        if self.path is None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self._thread.start()
        return self

    def progress(self, phase: str, iteration: int, **extra: Any) -> None:
        """The rank entered ``phase`` at ``iteration`` (``extra``: what in it, e.g. the
        start-up's step): progress, written at once."""
        if self.path is None:
            return
        with self._lock:
            kept = {k: self.state[k] for k in ("rank", "host", "pid", "compute_seconds")
                    if k in self.state}  # fmt: skip
            progress = self.state["progress"] + 1
            self.state = {**kept, **extra, "phase": phase, "iteration": iteration,
                          "progress": progress, "since": time.time()}  # fmt: skip
        self._write()

    def compute(self, seconds: float) -> None:
        """The rank's compute time per iteration (the median of its last few, without
        the time it waits in the gradient all-reduce): kept in every beat from now on,
        for the segment's straggler check (hpcllm.training.campaign.stragglers)."""
        with self._lock:
            self.state["compute_seconds"] = round(seconds, 6)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.every + 1)

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            self._write()

    def _write(self) -> None:
        with self._lock:
            text = json.dumps({**self.state, "time": time.time()})
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            try:
                tmp.write_text(text)
                os.replace(tmp, self.path)
            except OSError:  # a full or lagging file system must not stop the training
                pass


def read_heartbeats(folder: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """Every rank's last heartbeat in ``folder`` (rank -> fields); unreadable ones left out."""
    found = {}
    for path in Path(folder).glob("rank*.json"):
        try:
            beat = json.loads(path.read_text())
            found[int(beat["rank"])] = beat
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found
