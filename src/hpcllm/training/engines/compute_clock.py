"""A rank's compute time per iteration, without the time it waits for the other ranks:
what names a straggler (hpcllm.training.campaign.stragglers).

DDP's collectives run inside the wrapped model's calls: its buffer broadcast before the
inner module's forward, its gradient all-reduce in the backward of the micro-step that
synchronises. So the clock times the inner module's forward through its own hooks (after
the broadcast), and the caller times the other parts without a collective
(:meth:`ComputeClock.timed`: the loss, the backward of the micro-steps under
``no_sync``, the optimizer's step); the synchronising backward is left out, as it cannot
tell compute from waiting. Every rank leaves out the same part, so the ranks' times
compare; a GPU slow in everything is slow in what is timed. On a GPU the clock waits for
the device at each edge of a timed part (``synchronize``), or it would time the kernels'
launch only.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

# The median of the last few iterations: one slow iteration (a page fault, an
# evaluation's aftermath) does not make a straggler; a slow node is slow in most.
KEEP = 8


class ComputeClock:
    def __init__(self, inner_module, keep: int = KEEP, synchronize=None):
        self._sync = synchronize or (lambda: None)
        self.seconds = 0.0  # this iteration's, so far
        self.recent: deque[float] = deque(maxlen=keep)
        self._forward_start: float | None = None
        inner_module.register_forward_pre_hook(self._before_forward)
        inner_module.register_forward_hook(self._after_forward)

    def _before_forward(self, module, args) -> None:
        self._sync()  # after DDP's buffer broadcast: its wait is not compute
        self._forward_start = time.perf_counter()

    def _after_forward(self, module, args, output) -> None:
        if self._forward_start is not None:
            self._sync()
            self.seconds += time.perf_counter() - self._forward_start
            self._forward_start = None

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Count the block's time as compute (call it only around code without a
        collective)."""
        self._sync()
        started = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds += time.perf_counter() - started

    def end_iteration(self) -> float:
        """Close the iteration; the median compute time of the last ``keep``."""
        self.recent.append(self.seconds)
        self.seconds = 0.0
        return statistics.median(self.recent)
