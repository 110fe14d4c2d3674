"""Stage-in for a distributed job, timed per node (EPICURE notes it costs minutes of GPU
time on every node of the job).

Methods:
- ``copy``: the first rank of every node copies the LMDBs from the shared file system
  (:func:`hpcllm.vision.stage_in.stage_in`, verified by CRC-32); every node reads the
  whole LMDB from the shared file system.
- ``sbcast``: rank 0 runs Slurm's ``sbcast``, which reads each file once from the shared
  file system and broadcasts it to the same path on every node of the allocation
  (Slurm's tree fan-out); each node then checks its copy (size and record count). Only
  inside a Slurm job with ``sbcast`` on the PATH; elsewhere the job falls back to
  ``copy`` with a warning, and the record says which ran.

Per node, the time runs from a barrier of all ranks to that node's verified copies.

While the first rank of a node copies, every other rank of the job waits, the ranks of the
nodes that finished first included. They wait in a CPU group of their own (gloo, over TCP)
whose timeout is sized to the copy (:func:`stage_timeout_s`), never in a collective of the
job's NCCL group: its watchdog aborts the job after its timeout (10 minutes by default),
which a slow copy of ImageNet at 64 nodes exceeds. The NCCL group sees no operation until
every node has its copies.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from hpcllm.vision.stage_in import (
    StageInError,
    _entries,
    check_free_space,
    remove_staged,
    stage_in,
    staged_path,
)

log = logging.getLogger(__name__)
METHODS = ("copy", "sbcast")
# The stage-in wait's default timeout: a fixed margin plus the bytes at a per-node rate
# taken as the slowest a busy shared file system gives each of 64 nodes reading the same
# LMDB (an assumption, not a measurement): 50 MB/s, so about an hour for the ~150 GB of
# ImageNet-1k's JPEGs. The experiment's stage_in_timeout_s replaces it.
STAGE_MARGIN_S = 600.0
STAGE_RATE_FLOOR_BYTES_S = 50e6


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def sbcast_usable() -> bool:
    return shutil.which("sbcast") is not None and "SLURM_JOB_ID" in os.environ


def resolve_method(requested: str) -> str:
    if requested not in METHODS:
        raise ValueError(f"stage_in_method must be one of {', '.join(METHODS)}, not {requested!r}")
    if requested == "sbcast" and not sbcast_usable():
        log.warning("stage_in_method sbcast: not inside a Slurm job with sbcast; copying instead")
        return "copy"
    return requested


def sbcast(src: Path, dest: Path, timeout_s: float = 3600) -> None:
    """Broadcast the file ``src`` to ``dest`` on every node of this job."""
    cmd = ["sbcast", "--force", str(src), str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise StageInError(
            f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout}"
        )


def verify_copy(src: Path, copy: Path) -> None:
    size = (src / "data.mdb").stat().st_size
    if not (copy / "data.mdb").is_file() or (copy / "data.mdb").stat().st_size != size:
        raise StageInError(f"{copy}: the copy of {src} is missing or has another size")
    if _entries(copy) != _entries(src):
        raise StageInError(f"{copy}: the copy of {src} holds another number of records")


def stage_timeout_s(total_bytes: int, timeout_s: float | None = None) -> float:
    """How long ranks wait for every node's copies: ``timeout_s`` when given (the
    experiment's ``stage_in_timeout_s``), else sized to the copy (the module's constants)."""
    if timeout_s:
        return float(timeout_s)
    return STAGE_MARGIN_S + total_bytes / STAGE_RATE_FLOOR_BYTES_S


class _StageGroup:
    """The ranks' waits during stage-in: a gloo group with the stage-in timeout (no GPU
    collective; see the module doc), or nothing outside a distributed job."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.group = None
        if dist.is_initialized():
            self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))

    def _wait(self, what: str, call):
        try:
            return call()
        except RuntimeError as e:
            raise StageInError(
                f"stage-in: waiting for {what} failed after at most {self.timeout_s:.0f} s: "
                f"{e}. If it timed out, the copies took longer than that: set "
                "stage_in_timeout_s in the experiment (docs/vision.md) or check the shared "
                "file system; otherwise another rank failed (its log says why)."
            ) from e

    def barrier(self, what: str) -> None:
        if self.group is not None:
            self._wait(what, lambda: dist.barrier(group=self.group))

    def gather(self, obj, what: str) -> list:
        if self.group is None:
            return [obj]
        gathered: list = [None] * dist.get_world_size()
        self._wait(what, lambda: dist.all_gather_object(gathered, obj, group=self.group))
        return gathered

    def close(self) -> None:
        if self.group is not None:
            dist.destroy_process_group(self.group)
            self.group = None


def stage_for_job(
    sources: Sequence[str | os.PathLike],
    base: str | os.PathLike,
    method: str,
    rank: int,
    local_rank: int,
    timeout_s: float | None = None,
) -> tuple[list[Path], dict, Callable[[], None]]:
    """Stage ``sources`` under ``base`` on every node; every rank must call it.

    Returns the paths of the copies, the record (``method``, ``seconds_per_node``,
    ``dirs`` per node, ``bytes``, ``timeout_s``) and a function that removes this node's
    copies (call it on every rank). The ranks wait for the copies up to ``timeout_s``
    (default: sized to the bytes, :func:`stage_timeout_s`), in a CPU group of their own.
    """
    base = Path(os.path.expandvars(str(base)))
    if not base.is_dir():
        raise StageInError(
            f"node-local storage {base} does not exist; fix local_storage in the cluster "
            "facts file or set stage_in: false"
        )
    method = resolve_method(method)
    srcs = [Path(s).resolve() for s in sources]
    total_bytes = sum((s / "data.mdb").stat().st_size for s in srcs)
    group = _StageGroup(stage_timeout_s(total_bytes, timeout_s))
    run = f"hpcllm-{os.environ.get('HPCLLM_RUN_ID', 'run')}-{os.environ.get('SLURM_JOB_ID', os.getppid())}"
    # sbcast writes one path on every node; a per-node copy names its node, so nodes that
    # share a directory (the test cluster's, on one host) do not overwrite each other.
    dest = base / (run if method == "sbcast" else f"{run}-{node_name()}")
    group.barrier("every rank to start")
    start = time.monotonic()
    if method == "copy":
        if local_rank == 0:
            dest.mkdir(exist_ok=True)
            for src in srcs:
                stage_in(src, dest)
    else:
        if local_rank == 0:
            dest.mkdir(exist_ok=True)
            check_free_space(srcs, dest)
            for src in srcs:
                staged_path(src, dest).mkdir(parents=True, exist_ok=True)
        group.barrier("every node's destination folder")
        if rank == 0:
            for src in srcs:
                sbcast(src / "data.mdb", staged_path(src, dest) / "data.mdb")
        group.barrier("sbcast")
        if local_rank == 0:
            for src in srcs:
                verify_copy(src, staged_path(src, dest))
    seconds = time.monotonic() - start
    mine = (node_name(), seconds, str(dest)) if local_rank == 0 else None
    # Every rank waits here until the slowest node has its copies.
    nodes = [g for g in group.gather(mine, "every node's copies") if g]
    record = {
        "method": method,
        "seconds_per_node": {node: s for node, s, _ in nodes},
        "dirs": {node: d for node, _, d in nodes},
        "bytes": total_bytes,
        "timeout_s": group.timeout_s,
    }
    copies = [staged_path(src, dest) for src in srcs]

    def cleanup() -> None:
        group.close()
        if dist.is_initialized():
            dist.barrier()  # nobody reads any more (after training: all ranks are there)
        if local_rank == 0:
            for copy in copies:
                remove_staged(copy)
            shutil.rmtree(dest, ignore_errors=True)

    return copies, record, cleanup


def main(argv: list[str] | None = None) -> int:
    """Stage, print the record (rank 0), remove: one task per node under ``srun``, e.g.
    ``srun --ntasks-per-node=1 python -m hpcllm.vision.stage_job --method sbcast --dest
    /dev/shm data/vision/imagenet/train.lmdb`` (benchmarks/stage_in_methods.py)."""
    import argparse
    import json

    parser = argparse.ArgumentParser(
        prog="python -m hpcllm.vision.stage_job", description=main.__doc__
    )
    parser.add_argument("--method", choices=METHODS, default="copy")
    parser.add_argument("--dest", required=True, help="node-local directory")
    parser.add_argument("--master", help="host:port of rank 0's rendezvous (default: first node)")
    parser.add_argument("lmdb", nargs="+")
    args = parser.parse_args(argv)
    rank, world = int(os.environ.get("SLURM_PROCID", 0)), int(os.environ.get("SLURM_NTASKS", 1))
    local_rank = int(os.environ.get("SLURM_LOCALID", 0))
    if world > 1:
        dist.init_process_group(
            "gloo", init_method=f"tcp://{args.master}", rank=rank, world_size=world
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    _, record, cleanup = stage_for_job(args.lmdb, args.dest, args.method, rank, local_rank)
    cleanup()
    if rank == 0:
        print(json.dumps(record), flush=True)
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
