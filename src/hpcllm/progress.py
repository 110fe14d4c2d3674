"""Progress lines for long jobs: done of total, share, rate and the time left.

``tokenize 0003: 1,234 of 5,000 documents (24.7%), 812 documents/s, ETA 0:00:05``

The rate (and so the ETA) is measured from the first update that reports work done, not
from the start: a training segment's start-up can take minutes before its first
iteration, and counting it made the first ETA many times too long.

A line at most every ``interval`` seconds (and one at the end), through the logger
``hpcllm.progress``, which :func:`hpcllm.logs.setup` also sends to stderr: the job's log
file has it, and so has the terminal of a job run locally (Snakemake passes a local job's
stderr through) or the Slurm job's output file.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from datetime import timedelta

log = logging.getLogger("hpcllm.progress")
# Often enough to see movement, rare enough for week-long jobs; HPCLLM_PROGRESS_S sets it.
INTERVAL_S = float(os.environ.get("HPCLLM_PROGRESS_S", "30"))


def _rate(rate: float) -> str:
    """Three significant digits or more: a segment's 0.05 iterations/s is not "0"."""
    if rate >= 100:
        return f"{rate:,.0f}"
    return f"{rate:.1f}" if rate >= 10 else f"{rate:.2g}"


def _eta(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


class Progress:
    """Reports ``done`` of ``total`` (None: unknown, then no share and no ETA)."""

    def __init__(
        self,
        what: str,
        total: float | None,
        unit: str,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        emit: Callable[[str], None] | None = None,
    ) -> None:
        self.what, self.total, self.unit = what, total, unit
        self.interval = INTERVAL_S if interval is None else interval
        self.clock = clock
        self.emit = emit or log.info
        self.start = self.last = clock()
        self.done = 0.0
        # (time, done) of the first update with work done: the rate is measured from there,
        # as start-up (a model built, a first iteration compiled) is not the pace of the rest.
        self.first: tuple[float, float] | None = None

    def rate(self, done: float) -> float | None:
        """Units per second since the first update with work done; None until a later one
        adds work (a final line without updates: since the start)."""
        now = self.clock()
        if self.first is not None and done > self.first[1] and now > self.first[0]:
            return (done - self.first[1]) / (now - self.first[0])
        return None

    def line(self, done: float, final: bool = False) -> str:
        elapsed = max(self.clock() - self.start, 1e-9)
        rate = self.rate(done)
        if rate is None and final:
            rate = done / elapsed
        if self.total:
            share = f" of {self.total:,.0f} {self.unit} ({100 * done / self.total:.1f}%)"
        else:
            share = f" {self.unit}"
        text = f"{self.what}: {done:,.0f}{share}"
        if rate is not None:
            text += f", {_rate(rate)} {self.unit}/s"
        if final:
            text += f", done in {_eta(elapsed)}"
        elif self.total and done < self.total and rate:
            text += f", ETA {_eta((self.total - done) / rate)}"
        return text

    def update(self, done: float) -> None:
        """Record ``done``; emit a line when ``interval`` has passed since the last."""
        self.done = done
        now = self.clock()
        if self.first is None and done > 0:
            self.first = (now, done)
        if now - self.last >= self.interval:
            self.last = now
            self.emit(self.line(done))

    def finish(self, done: float | None = None) -> None:
        self.emit(self.line(self.done if done is None else done, final=True))
