"""Parse training logs: Megatron's per-iteration line (current and old forms) and the
vision benchmark's JSON lines.

Megatron-LM's ``training_log`` prints, on the last rank, one line per ``--log-interval``:

current (2024-): `` [2026-02-06 20:55:02.918469] iteration  292/ 9536 | consumed samples: 9344 |
elapsed time per iteration (ms): 3075.7 | throughput per GPU (TFLOP/s/GPU): 478.0 |
energy per GPU (J/iter/GPU): 1992.5 | power per GPU (W/GPU): 647.8 | learning rate: ... |
global batch size: 32 | lm loss: ... | grad norm: ... |`` (the timestamp had no
microseconds before 2025; the throughput field needs ``--log-throughput``, the energy
fields ``--log-energy``).

old (Megatron-DeepSpeed, Megatron-LM before 2023): `` iteration 12695/ 115311 | consumed
samples: ... | elapsed time per iteration (s): 105.22 | ... | samples per second: 19.463 |
TFLOPs: 149.02 |``.

Under ``torchrun --tee`` every line carries a ``[defaultN]:`` prefix, and lines of several
ranks can be glued together. Unrelated lines are skipped; a line cut off by a killed job
is not counted as an iteration but flagged as ``truncated``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

_RANK_PREFIX = re.compile(r"\[default\d+\]:")
_ITERATION = re.compile(
    r"(?:\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?)\]\s*)?"
    r"iteration\s+(?P<it>\d+)\s*/\s*(?P<total>\d+)\s*\|(?P<fields>.*)$"
)
_FIELD = re.compile(
    r"^\s*(?P<key>[^:|]+?)\s*:\s*(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$"
)

# Field names of both forms -> attribute and a factor to the attribute's unit.
_FIELDS: dict[str, tuple[str, float]] = {
    "elapsed time per iteration (ms)": ("elapsed_s", 1e-3),
    "elapsed time per iteration (s)": ("elapsed_s", 1.0),
    "throughput per GPU (TFLOP/s/GPU)": ("tflops_per_gpu", 1.0),
    "TFLOPs": ("tflops_per_gpu", 1.0),
    "energy per GPU (J/iter/GPU)": ("energy_j_per_gpu", 1.0),
    "power per GPU (W/GPU)": ("power_w_per_gpu", 1.0),
    "consumed samples": ("consumed_samples", 1.0),
    "global batch size": ("global_batch_size", 1.0),
    "lm loss": ("lm_loss", 1.0),
    "learning rate": ("learning_rate", 1.0),
    "grad norm": ("grad_norm", 1.0),
    "samples per second": ("samples_per_s", 1.0),
    "number of skipped iterations": ("skipped_iterations", 1.0),
    "number of nan iterations": ("nan_iterations", 1.0),
}
_INTS = {"consumed_samples", "global_batch_size", "skipped_iterations", "nan_iterations"}


@dataclass
class Iteration:
    """One logged iteration; fields the log did not carry are None."""

    iteration: int
    train_iters: int
    line: int
    elapsed_s: float
    timestamp: datetime | None = None
    tflops_per_gpu: float | None = None
    energy_j_per_gpu: float | None = None
    power_w_per_gpu: float | None = None
    consumed_samples: int | None = None
    global_batch_size: int | None = None
    lm_loss: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    samples_per_s: float | None = None
    skipped_iterations: int | None = None
    nan_iterations: int | None = None
    log_format: str = "current"


@dataclass
class MegatronLog:
    path: str
    iterations: list[Iteration] = field(default_factory=list)
    truncated: bool = False  # the last iteration line was cut off
    lines: int = 0


def parse_iteration_line(text: str, line: int = 0) -> Iteration | None:
    """An :class:`Iteration` from one line (without rank prefix), or None if it is not one.

    A line with the iteration header but no elapsed time (cut off) gives None too.
    """
    m = _ITERATION.search(text)
    if not m:
        return None
    values: dict[str, float] = {}
    old = False
    for part in m["fields"].split("|"):
        f = _FIELD.match(part)
        if not f or f["key"] not in _FIELDS:
            continue
        name, factor = _FIELDS[f["key"]]
        old = old or f["key"] in ("elapsed time per iteration (s)", "TFLOPs")
        values[name] = float(f["value"]) * factor
    if "elapsed_s" not in values:
        return None
    record = Iteration(
        iteration=int(m["it"]),
        train_iters=int(m["total"]),
        line=line,
        elapsed_s=values.pop("elapsed_s"),
        timestamp=_timestamp(m["ts"]),
        log_format="old" if old else "current",
    )
    for name, value in values.items():
        setattr(record, name, int(value) if name in _INTS else value)
    return record


def _timestamp(text: str | None) -> datetime | None:
    if not text:
        return None
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in text else "%Y-%m-%d %H:%M:%S"
    return datetime.strptime(text, fmt)


def parse_megatron_log(path: str | Path) -> MegatronLog:
    """Every iteration of a Megatron-format log, each once (the first rank that printed it)."""
    path = Path(path)
    result = MegatronLog(str(path))
    seen: set[int] = set()
    cut = False
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, raw in enumerate(f, 1):
            result.lines = number
            complete = raw.endswith("\n")
            for chunk in _RANK_PREFIX.split(raw.rstrip("\n")):
                if "iteration" not in chunk:
                    continue
                # A killed job's last line, cut mid-number, still looks like an
                # iteration: Megatron ends every iteration line with "|".
                whole = chunk.rstrip().endswith("|")
                record = parse_iteration_line(chunk, number) if whole else None
                if record is None:
                    cut = cut or (_ITERATION.search(chunk) is not None or not complete)
                    continue
                if record.iteration not in seen:
                    seen.add(record.iteration)
                    result.iterations.append(record)
                    cut = False
    result.truncated = cut
    return result


@dataclass
class VisionLog:
    """The vision benchmark's records: ``start`` (settings), ``stage_in``, ``batch``,
    ``epoch``, ``end``."""

    path: str
    start: dict | None = None
    stage_in: dict | None = None
    batches: list[dict] = field(default_factory=list)
    epochs: list[dict] = field(default_factory=list)
    end: dict | None = None
    truncated: bool = False


def parse_vision_log(path: str | Path) -> VisionLog:
    """The JSON records of a vision run's log; other lines (warnings, prefixes) are skipped."""
    path = Path(path)
    result = VisionLog(str(path))
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            text = _RANK_PREFIX.sub("", raw).strip()
            if not text.startswith("{"):
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError:
                result.truncated = result.truncated or not raw.endswith("\n")
                continue
            event = record.get("event")
            if event == "start":
                result.start = record
            elif event == "stage_in":
                result.stage_in = record
            elif event == "batch":
                result.batches.append(record)
            elif event == "epoch":
                result.epochs.append(record)
            elif event == "end":
                result.end = record
    return result
