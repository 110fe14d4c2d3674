"""Copy packed LMDBs to node-local storage at job start and remove them at the end.

Random reads of a shared parallel file system (Lustre, GPFS) are what makes training
crawl; a copy on ``/dev/shm``, ``$TMPDIR`` or a local SSD is read at memory or SSD speed.
The copy is made under a temporary name, checked (size, CRC-32 of the source as read
against the copy as written, the LMDB's record count) and renamed. Run it once per node:

    with staged(["data/vision/imagenet/train.lmdb"], "/dev/shm/hpcllm") as (train,):
        dataset = LMDBImageDataset(train)

or around a command (``srun --ntasks-per-node=1 python -m hpcllm.vision.stage_in --dest
/dev/shm/hpcllm data/vision/imagenet/train.lmdb -- torchrun ...``): the command finds the
copies in ``$HPCLLM_STAGED_LMDB`` (paths joined by ``:``, in the order given) and they
are removed when it ends, also when Slurm cancels it (SIGTERM, SIGINT, SIGUSR1 are passed
on to the command).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from hpcllm.atomic import temporary_path
from hpcllm.vision.lmdb_env import close_environment, shared_environment

log = logging.getLogger(__name__)

ENV_VAR = "HPCLLM_STAGED_LMDB"
_BLOCK = 16 << 20
# Left free on the node-local file system besides the copies (tmpfs is the node's RAM).
DEFAULT_RESERVE_BYTES = 1 << 30


class StageInError(RuntimeError):
    pass


def staged_path(lmdb_path: str | os.PathLike, dest_dir: str | os.PathLike) -> Path:
    """Where ``data/vision/<dataset>/<split>.lmdb`` goes: ``<dest>/<dataset>/<split>.lmdb``."""
    src = Path(lmdb_path)
    return Path(dest_dir) / src.resolve().parent.name / src.name


def _copy_with_crc(src: Path, dst: Path) -> int:
    crc = 0
    buf = bytearray(_BLOCK)
    view = memoryview(buf)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while n := fin.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
            fout.write(view[:n])
    return crc


def _crc(path: Path) -> int:
    crc = 0
    buf = bytearray(_BLOCK)
    view = memoryview(buf)
    with open(path, "rb") as f:
        while n := f.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
    return crc


def _entries(lmdb_dir: Path) -> int:
    env = shared_environment(lmdb_dir)
    return env.stat()["entries"]


def check_free_space(
    sources: Sequence[Path], dest_dir: Path, reserve_bytes: int = DEFAULT_RESERVE_BYTES
) -> None:
    """Raise StageInError unless ``dest_dir`` can hold ``sources`` plus ``reserve_bytes``."""
    if not dest_dir.is_dir():
        raise StageInError(
            f"node-local directory {dest_dir} does not exist (an unset variable such as "
            "$TMPDIR?); set the cluster's node-local path in its facts file"
        )
    needed = sum((s / "data.mdb").stat().st_size for s in sources)
    # Copies already there from an earlier stage-in on this node are replaced: count them free.
    present = sum(
        (staged_path(s, dest_dir) / "data.mdb").stat().st_size
        for s in sources
        if (staged_path(s, dest_dir) / "data.mdb").is_file()
    )
    free = shutil.disk_usage(dest_dir).free + present
    if needed + reserve_bytes > free:
        raise StageInError(
            f"not enough space in {dest_dir} to stage {', '.join(map(str, sources))}: "
            f"needs {needed / 1e9:.2f} GB plus {reserve_bytes / 1e9:.2f} GB reserve, "
            f"{free / 1e9:.2f} GB free. Use a larger node-local path (a local SSD or "
            "$TMPDIR instead of /dev/shm) in the cluster facts file, request nodes with more "
            "memory, or use TinyImageNet"
        )


def stage_in(
    lmdb_path: str | os.PathLike,
    dest_dir: str | os.PathLike,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
) -> Path:
    """Copy the LMDB directory ``lmdb_path`` into ``dest_dir``, verified; return the copy."""
    src = Path(lmdb_path)
    if not (src / "data.mdb").is_file():
        raise StageInError(f"{src}: not an LMDB directory (no data.mdb); run pack_lmdb first")
    dest_dir = Path(dest_dir)
    check_free_space([src], dest_dir, reserve_bytes)
    final = staged_path(src, dest_dir)
    tmp = temporary_path(final)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    start = time.monotonic()
    try:
        crc = _copy_with_crc(src / "data.mdb", tmp / "data.mdb")
        size = (src / "data.mdb").stat().st_size
        if (tmp / "data.mdb").stat().st_size != size or _crc(tmp / "data.mdb") != crc:
            raise StageInError(f"the copy of {src} in {tmp} differs from the source")
        if _entries(tmp) != _entries(src):
            raise StageInError(f"the copy of {src} in {tmp} holds another number of records")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        close_environment(tmp)
    remove_staged(final)  # an older copy on this node
    os.replace(tmp, final)
    seconds = time.monotonic() - start
    log.info(
        "staged %s to %s: %.2f GB in %.1f s (%.2f GB/s)",
        src, final, size / 1e9, seconds, size / 1e9 / max(seconds, 1e-9),
    )  # fmt: skip
    return final


def remove_staged(path: str | os.PathLike) -> None:
    close_environment(path)
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):  # the <dataset> folder, when nothing else is in it
        Path(path).parent.rmdir()


@contextlib.contextmanager
def staged(
    lmdb_paths: Sequence[str | os.PathLike],
    dest_dir: str | os.PathLike,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
) -> Iterator[list[Path]]:
    """Stage ``lmdb_paths`` into ``dest_dir``; yield the copies; remove them on exit."""
    sources = [Path(p) for p in lmdb_paths]
    check_free_space(sources, Path(dest_dir), reserve_bytes)  # all of them, before copying
    copies: list[Path] = []
    try:
        for src in sources:
            copies.append(stage_in(src, dest_dir, reserve_bytes=0))
        yield copies
    finally:
        for copy in copies:
            remove_staged(copy)


def run_staged(
    lmdb_paths: Sequence[str], dest_dir: str, command: Sequence[str], reserve_bytes: int
) -> int:
    """Stage, run ``command`` with $HPCLLM_STAGED_LMDB set, remove; return its exit code."""
    with staged(lmdb_paths, dest_dir, reserve_bytes) as copies:
        env = {**os.environ, ENV_VAR: os.pathsep.join(map(str, copies))}
        child = subprocess.Popen(command, env=env)

        def forward(signum, frame):
            child.send_signal(signum)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, forward)
        return child.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpcllm.vision.stage_in",
        description="Copy LMDBs to node-local storage, run a command, remove the copies.",
    )
    parser.add_argument("--dest", required=True, help="node-local directory (/dev/shm/...)")
    parser.add_argument("--reserve-gb", type=float, default=DEFAULT_RESERVE_BYTES / 1e9)
    parser.add_argument("lmdb", nargs="+", help="LMDB directories (data/vision/...lmdb)")
    parser.epilog = "Then -- and the command to run with the copies in $" + ENV_VAR + "."
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("give the command to run after --")
    split = argv.index("--")
    args, command = parser.parse_args(argv[:split]), argv[split + 1 :]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        return run_staged(args.lmdb, args.dest, command, int(args.reserve_gb * 1e9))
    except StageInError as e:
        log.error("%s", e)
        return 2


if __name__ == "__main__":
    sys.exit(main())
