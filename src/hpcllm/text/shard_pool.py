"""Many tokenize shards in one Slurm job, side by side over the node's cores.

On sites where every Slurm job gets a whole node and there is no CPU partition (JUWELS
Booster, JUPITER, Leonardo Booster), one job per shard would hold a GPU node for a few
threads' work. Snakemake's job groups were meant to pack the shards per node, but inside
the group job the Slurm job step's Snakemake runs them one at a time (the executor plugin
starts it with ``--jobs 1`` and its job-step executor waits for each job before the next:
docs/measurements/text.md, "Why not Snakemake job groups"). So a batch of shards is one
Snakemake job, and this module runs its shards in parallel, each in its own process.

What a batch guarantees:

- every shard's ``.bin/.idx`` are renamed into place only when complete (the writer's
  temporary names), and a per-shard record (``<prefix>.shard.json``: inputs' sizes and
  modification times, the settings, the outputs' sizes, start and end times) is written
  after them, atomically;
- a shard that fails (bad input, killed process) does not stop the others; the batch then
  fails naming every failed shard and its log;
- a rerun of the batch redoes only the shards whose record is missing or no longer matches
  (inputs, settings or outputs changed): the Snakemake job declares only the batch's own
  record as output, so the shards that succeeded are not deleted when the batch fails.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RECORD_SUFFIX = ".shard.json"


class ShardPoolError(RuntimeError):
    """Some shards of a batch failed; the others are done and kept."""


@dataclass(frozen=True)
class ShardTask:
    """One shard of a batch: ``work(**kwargs)`` writes ``{prefix}.bin/.idx``."""

    name: str
    prefix: str
    inputs: tuple[str, ...]
    log: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    # The files ``work`` writes: the prefix with these endings (a shard's own manifest too,
    # where the work writes one).
    suffixes: tuple[str, ...] = (".bin", ".idx")

    @property
    def record(self) -> Path:
        return Path(self.prefix + RECORD_SUFFIX)

    def outputs(self) -> tuple[Path, ...]:
        return tuple(Path(self.prefix + s) for s in self.suffixes)


def _stat(path: str | os.PathLike) -> list[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def task_identity(task: ShardTask) -> dict[str, Any]:
    """What a shard's outputs depend on: its inputs (path, size, mtime) and its settings."""
    return {
        "inputs": [[str(p), *_stat(p)] for p in task.inputs],
        "kwargs": json.loads(json.dumps(task.kwargs, default=str)),
    }


def shard_done(task: ShardTask) -> bool:
    """True when the shard's record matches its inputs, settings and output files."""
    try:
        record = json.loads(task.record.read_text())
        identity = task_identity(task)
        outputs = [_stat(p) for p in task.outputs()]
    except (OSError, ValueError):
        return False
    return record.get("identity") == identity and record.get("outputs") == outputs


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def resolve(work: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function (importable in a spawned process)."""
    module, _, name = work.partition(":")
    return getattr(importlib.import_module(module), name)


def _run_task(work: str, task: ShardTask) -> None:
    """In the shard's own process: its log, the work, then its record."""
    from hpcllm import logs

    Path(task.log).parent.mkdir(parents=True, exist_ok=True)
    logs.setup(task.log)
    start = time.time()
    log.info("shard %s started (pid %d)", task.name, os.getpid())
    try:
        identity = task_identity(task)
        result = resolve(work)(**task.kwargs)
    except BaseException as e:
        # The reason on the ERROR line itself: the batch's error quotes it (failures).
        logging.getLogger("hpcllm").error(
            "shard %s failed: %s: %s\n%s", task.name, type(e).__name__, e, traceback.format_exc()
        )
        raise
    end = time.time()
    record = {
        "shard": task.name,
        "identity": identity,
        "outputs": [_stat(p) for p in task.outputs()],
        "start": start,
        "end": end,
        "pid": os.getpid(),
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
        "result": json.loads(json.dumps(getattr(result, "__dict__", result), default=str)),
    }
    _write_json_atomic(task.record, record)
    log.info("shard %s done in %.1f s", task.name, end - start)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hpcllm.text.shard_pool WORK TASK_JSON``: one shard, in its own process
    (a fresh interpreter: nothing of the batch job's script or its threads is copied)."""
    work, task_json = argv if argv is not None else sys.argv[1:]
    task = ShardTask(**json.loads(task_json))
    try:
        fields = {**task.__dict__, "inputs": tuple(task.inputs), "suffixes": tuple(task.suffixes)}
        _run_task(work, ShardTask(**fields))
    except BaseException:
        return 1
    return 0


@dataclass
class BatchResult:
    done: list[str]  # shards run by this call
    skipped: list[str]  # shards already done (record matches)


def _reason(task: ShardTask) -> str:
    """``: <the error>`` a failed shard logged (none for a killed process)."""
    from hpcllm.failures.summary import reason_line

    reason = reason_line(task.log) or ""
    prefix = f"shard {task.name} failed: "
    return f": {reason.removeprefix(prefix)}" if reason.startswith(prefix) else ""


def run_batch(
    tasks: Sequence[ShardTask],
    work: str,
    workers: int,
    poll_seconds: float = 0.2,
) -> BatchResult:
    """Run ``work`` for every task not yet done, at most ``workers`` processes at a time.

    ``work`` names a function ``"module:function"`` called as ``work(**task.kwargs)`` in a
    fresh Python process per shard (``python -m hpcllm.text.shard_pool``; a killed one
    fails its shard only).
    Raises :class:`ShardPoolError` naming the failed shards and their logs after every
    other shard has run.
    """
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"shard names repeat in the batch: {names}")
    todo = [t for t in tasks if not shard_done(t)]
    skipped = [t.name for t in tasks if t not in todo]
    if skipped:
        log.info("%d shard(s) already done, kept: %s", len(skipped), ", ".join(skipped))
    for t in todo:
        t.record.unlink(missing_ok=True)  # stale: inputs, settings or outputs changed
    pending = list(todo)
    running: list[tuple[ShardTask, subprocess.Popen]] = []
    failed: list[tuple[ShardTask, int]] = []
    done: list[str] = []
    workers = max(1, workers)
    log.info("%d shard(s) to tokenize, %d at a time", len(todo), workers)
    # The shards' processes import this hpcllm (the checkout that planned the run).
    src = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
    }
    while pending or running:
        while pending and len(running) < workers:
            task = pending.pop(0)
            cmd = [sys.executable, "-m", "hpcllm.text.shard_pool", work, json.dumps(task.__dict__)]
            running.append((task, subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=env)))
        time.sleep(poll_seconds)
        for task, proc in list(running):
            code = proc.poll()
            if code is None:
                continue
            running.remove((task, proc))
            if code == 0 and task.record.exists():
                done.append(task.name)
                log.info("shard %s done", task.name)
            else:
                failed.append((task, code))
                log.error("shard %s failed (exit code %s): see %s", task.name, code, task.log)
    if failed:
        lines = "\n".join(
            f"  - shard {t.name}: exit code {code}, log {t.log}" + _reason(t) for t, code in failed
        )
        raise ShardPoolError(
            f"{len(failed)} of {len(tasks)} shard(s) failed (the other shards are done and "
            f"kept; a rerun redoes only the failed ones):\n{lines}"
        )
    return BatchResult(done=done, skipped=skipped)


# The tokenize rate assumed per shard process (4 threads), in MB of the shard's input
# file per second (compressed: .jsonl.zst, Parquet). Measured here with gigatoken: ~12 MB/s
# of text per 4-thread process on the 2-core test machine under a load of 17; web text
# compresses 3-5x, so ~2.5-4 MB/s of file. 1 MB/s leaves room for a slower file system,
# a busier node and better-compressed text.
ASSUMED_MB_PER_S = 1.0
# Margin on the estimate and minutes outside the shards (job start, spawning, imports).
MARGIN = 1.5
STARTUP_MINUTES = 5
ROUND_MINUTES = 5


def batch_minutes(
    shard_bytes: Sequence[int],
    workers: int,
    mb_per_s: float = ASSUMED_MB_PER_S,
    max_minutes: float | None = None,
) -> int:
    """A batch job's time limit from its work: its shards' input bytes spread over
    ``workers`` processes (largest first, each to the least loaded), the busiest
    process's bytes at ``mb_per_s``, times the margin, plus the start-up, rounded up to
    ``ROUND_MINUTES``, at most ``max_minutes`` (the partition's longest limit)."""
    loads = [0] * max(1, workers)
    for size in sorted(shard_bytes, reverse=True):
        loads[loads.index(min(loads))] += size
    minutes = max(loads) / (mb_per_s * 1e6) / 60 * MARGIN + STARTUP_MINUTES
    minutes = -(-minutes // ROUND_MINUTES) * ROUND_MINUTES
    if max_minutes is not None:
        minutes = min(minutes, max_minutes)
    return int(minutes)


def overlapping(records: Sequence[dict[str, Any]]) -> bool:
    """True when some two shards' [start, end] intervals overlap (ran side by side)."""
    spans = sorted((r["start"], r["end"]) for r in records)
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))


def read_record(prefix: str | os.PathLike) -> dict[str, Any]:
    return json.loads(Path(str(prefix) + RECORD_SUFFIX).read_text())


def write_batch_record(
    path: str | os.PathLike, tasks: Sequence[ShardTask], result: BatchResult
) -> None:
    """The batch job's output: its shards' records (start and end times, documents,
    tokens), which ran now and which were kept from an earlier run."""
    shards = []
    for t in tasks:
        r = read_record(t.prefix)
        shards.append({k: r[k] for k in ("shard", "start", "end", "pid", "slurm_job", "result")})
    _write_json_atomic(
        Path(path),
        {"shards": shards, "ran": result.done, "kept": result.skipped},
    )


def check_batch_outputs(
    batch_record: str | os.PathLike, suffixes: Sequence[str] = (".bin", ".idx", ".manifest.json")
) -> None:
    """Raise :class:`ShardPoolError` naming every shard of a finished batch whose files are
    missing or are no longer the ones its shard record lists (deleted or rewritten since
    the batch ran: Snakemake sees only the batch's record, so it would not redo them), and
    how to redo those shards alone."""
    record = json.loads(Path(batch_record).read_text())
    folder = Path(batch_record).parent
    problems = []
    for entry in record["shards"]:
        prefix = str(folder / f"{entry['shard']}_text_document")
        outputs = [Path(prefix + s) for s in suffixes]
        missing = [str(p) for p in outputs if not p.exists()]
        try:
            written = json.loads(Path(prefix + RECORD_SUFFIX).read_text())["outputs"]
        except (OSError, ValueError, KeyError):
            written = None
        if missing:
            problems.append(f"  - shard {entry['shard']}: {', '.join(missing)} missing")
        elif written is None or written != [_stat(p) for p in outputs]:
            problems.append(f"  - shard {entry['shard']}: {prefix}.* changed since the batch ran")
    if problems:
        raise ShardPoolError(
            f"{batch_record}: shards of this batch are not as it wrote them:\n"
            + "\n".join(problems)
            + f"\nDelete {batch_record} and run the workflow again: the batch then redoes "
            "these shards only and keeps the others."
        )


def tokenize_source_task(
    source: str,
    cfg: dict[str, Any],
    defaults: dict[str, Any],
    shard: int,
    num_shards: int,
    prefix: str,
    tokenizer: dict[str, Any],
    tokenizer_files: list[str],
    settings: dict[str, Any],
) -> dict[str, Any]:
    """One shard of a batch read straight from the source's files: the same call as the
    one-shard tokenize job's script (its .bin/.idx and manifest)."""
    from hpcllm.text.shards import source_policy, tokenize_source_shard
    from hpcllm.text.tokenizers_config import tokenizer_for

    manifest = tokenize_source_shard(
        source,
        cfg,
        source_policy(cfg, defaults, shard, num_shards),
        shard,
        num_shards,
        prefix,
        prefix + ".manifest.json",
        tokenizer_for(tokenizer, tokenizer_files),
        tokenizer["eod_token"],
        append_eod=settings["append_eod"],
        encoder=settings["encoder"],
        batch_bytes=settings["batch_bytes"],
        special_tokens_in_text=settings["special_tokens_in_text"],
    )
    return {"documents": manifest["documents"]}


if __name__ == "__main__":
    raise SystemExit(main())
