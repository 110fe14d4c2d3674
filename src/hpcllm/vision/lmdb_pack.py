"""Pack one split of an image tree into one LMDB (``pack_lmdb``).

Record format (version 1), documented in docs/vision.md:

- key ``b"%08d" % i`` (ASCII, zero-padded, i = 0 .. num_samples-1, in the sorted order of
  the images' paths) -> value ``struct.pack("<IH", label, len(name)) + name + image``:
  the class index (uint32), the image's path relative to the dataset root (UTF-8,
  length uint16) and the encoded image bytes exactly as in the source file.
- key ``b"__meta__"`` -> UTF-8 JSON: ``format`` ("hpcllm-lmdb-images"), ``version``,
  ``num_samples``, ``classes`` (wnids; class index = position), ``num_bytes`` (image
  bytes), ``dataset``, ``split``, ``layout``.

Files are read by a thread pool while the main thread checks and writes, so reading and
writing overlap; records go in with MDB_APPEND in large transactions, the map grows when full,
the disk writes of each transaction start as soon as it is committed (not all at the final
fsync), and the LMDB directory and its report are written under temporary names and renamed
when complete.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import json
import logging
import os
import shutil
import struct
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lmdb
from PIL import Image, UnidentifiedImageError

from hpcllm.atomic import atomic_path, temporary_path
from hpcllm.atomic import replace as replace_dir
from hpcllm.diskspace import DiskFull, describe
from hpcllm.progress import Progress
from hpcllm.vision.trees import BadInputError, Problem, Sample, SplitListing

log = logging.getLogger(__name__)

FORMAT = "hpcllm-lmdb-images"
VERSION = 1
META_KEY = b"__meta__"
RECORD_HEADER = struct.Struct("<IH")  # label, length of the path that follows
CHECKS = ("header", "decode")
MAX_PROBLEMS_SHOWN = 20
_CHUNK = 16  # images per read task: fewer futures, same overlap
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (glibc's malloc.h)
_SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h
# A transaction's bytes, and how far the readers may run ahead of the writer (two
# transactions: they go on reading while it commits). Every byte of the two is memory the
# process touches for the first time (a page fault per 4 KiB) before glibc reuses it:
# at 64 and 128 MB a 123 MB split faulted 47,600 times against 20,000 at 16 and 32 MB,
# and its pack took 0.24 against 0.20 CPU-s (docs/measurements/vision.md).
TXN_BYTES = 16 << 20
READ_AHEAD_BYTES = 32 << 20


def record_key(index: int) -> bytes:
    return b"%08d" % index


def image_problem(data: bytes | memoryview, check: str = "header") -> str | None:
    """Why ``data`` is not a usable image, or None.

    ``header``: Pillow recognises the format and parses the header, and a JPEG ends with
    its end-of-image marker (a truncated file does not). ``decode``: Pillow decodes the
    whole image (slower; also finds damage inside the compressed data that makes libjpeg
    fail).
    """
    if not data:
        return "empty file"
    try:
        with Image.open(io.BytesIO(data)) as im:
            fmt = im.format
            if check == "decode":
                im.load()
    except UnidentifiedImageError:
        return "not an image (Pillow cannot identify it)"
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        return f"corrupt image: {e}"
    if check == "header" and fmt == "JPEG":
        # The marker ends the file, give or take zero padding (a copy of the tail only).
        if not bytes(data[-4096:]).rstrip(b"\0").endswith(b"\xff\xd9"):
            return "truncated JPEG (no end-of-image marker)"
    return None


def _read_record(sample: Sample) -> tuple[bytearray, memoryview]:
    """The record of ``sample`` read straight into place (no copy); and its image part."""
    name = sample.key.encode("utf-8")
    head = RECORD_HEADER.pack(sample.label, len(name)) + name
    with open(sample.path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        record = bytearray(len(head) + size)
        record[: len(head)] = head
        image = memoryview(record)[len(head) :]
        done = 0
        while done < size and (n := f.readinto(image[done:])):
            done += n
    if done != size:
        raise OSError(f"read {done} of {size} bytes (the file changed while being read)")
    return record, image


def _read_chunk(
    samples: Sequence[Sample], check: str | None
) -> list[tuple[Sample, bytearray | None, int, str | None]]:
    """Records of ``samples`` with the image size and, if ``check``, the image's problem."""
    out = []
    for s in samples:
        try:
            record, image = _read_record(s)
        except OSError as e:
            out.append((s, None, 0, f"unreadable: {e.strerror or e}"))
            continue
        out.append((s, record, len(image), image_problem(image, check) if check else None))
    return out


def _read_ahead(
    samples: Sequence[Sample], check: str | None, threads: int, ahead_bytes: int = 0
) -> Iterator[tuple[Sample, bytearray | None, int, str | None]]:
    """Images in order, read and checked by ``threads`` threads a bounded distance ahead:
    ``threads`` x 4 chunks, or more to hold about ``ahead_bytes`` (sized from the first
    chunk), so that the readers go on reading while the writer commits a transaction."""
    window = max(2, threads * 4)
    sized = False
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="pack-read") as pool:
        pending: deque[Future] = deque()
        chunks = (samples[i : i + _CHUNK] for i in range(0, len(samples), _CHUNK))
        try:
            for chunk in chunks:
                pending.append(pool.submit(_read_chunk, chunk, check))
                if len(pending) >= window:
                    results = pending.popleft().result()
                    if not sized:
                        sized = True
                        chunk_bytes = max(1, sum(r[2] for r in results))
                        window = max(window, -(-ahead_bytes // chunk_bytes))
                    yield from results
            while pending:
                yield from pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()


def format_problems(problems: Sequence[Problem], what: str) -> str:
    shown = "\n".join(f"  {p}" for p in problems[:MAX_PROBLEMS_SHOWN])
    more = len(problems) - MAX_PROBLEMS_SHOWN
    return (
        f"{len(problems)} {what}:\n{shown}"
        + (f"\n  ... and {more} more" if more > 0 else "")
        + "\nFix or remove them, or set vision.on_bad_image: skip to leave them out "
        "(listed in the report next to the LMDB)."
    )


def _disk_full(
    error: lmdb.Error, folder: Path, out: Path, written: int, count: int, total: int,
    txn_bytes: int,
) -> DiskFull | None:  # fmt: skip
    """An LMDB error where ``folder``'s file system (the LMDB ``out`` being written) has
    less room than a transaction:
    a full disk, named with the space the whole LMDB needs (what its file took for the
    images so far, scaled to all of them: LMDB's pages add 2-90 % to small images); None
    for any other error."""
    try:
        free = shutil.disk_usage(folder).free
        on_disk = max(written, (folder / "data.mdb").stat().st_size)
    except OSError:
        return None
    if free >= 2 * txn_bytes:
        return None
    needed = int(on_disk / count * total) if count else None
    message = describe(out, needed=needed, written=None if needed else written)
    return DiskFull(f"{message} (LMDB: {error})")


class _Writer:
    """Appends records in transactions of about ``txn_bytes``; grows the map when full."""

    def __init__(self, path: Path, map_size: int, txn_bytes: int) -> None:
        # No lock file (one writer, readers open with lock=False); durability once at the
        # end (sync) instead of at every commit. Not writemap: writing through the map of a
        # sparse file measured 2-3x slower here than LMDB's own page writes.
        self.env = lmdb.open(
            str(path), map_size=map_size, subdir=True, lock=False, sync=False, metasync=False,
            readahead=False, meminit=False,
        )  # fmt: skip
        self.txn_bytes = txn_bytes
        self.txn = self.env.begin(write=True)
        self.flush = _Writeback(path / "data.mdb")
        # The records of the open transaction, to write again into a grown map.
        self.batch: list[tuple[bytes, bytes | bytearray]] = []
        self.batch_bytes = 0
        self.grown = 0

    def put(self, key: bytes, value: bytes | bytearray) -> None:
        """Write now (overlapping the reader threads), commit every ``txn_bytes``."""
        self.batch.append((key, value))
        self.batch_bytes += len(value)
        try:
            self.txn.put(key, value, append=True)
        except lmdb.MapFullError:  # LMDB aborted the transaction: grow, write it again
            self._grow_and_replay()
        if self.batch_bytes >= self.txn_bytes:
            self.commit()

    def _grow_and_replay(self) -> None:
        while True:
            self.txn.abort()
            new_size = self.env.info()["map_size"] * 2 + 2 * self.batch_bytes
            log.info("LMDB map full, growing it to %.1f GB", new_size / 1e9)
            self.env.set_mapsize(new_size)
            self.grown += 1
            self.txn = self.env.begin(write=True)
            try:
                for key, value in self.batch:
                    self.txn.put(key, value, append=True)
                return
            except lmdb.MapFullError:
                continue

    def commit(self) -> None:
        try:
            self.txn.commit()
        except lmdb.MapFullError:  # the commit's own pages did not fit
            self._grow_and_replay()
            self.txn.commit()
        self.batch.clear()
        self.batch_bytes = 0
        self.flush.start()
        self.txn = self.env.begin(write=True)

    def close(self, sync: bool) -> None:
        if sync:
            self.commit()
            self.env.sync(True)
        try:
            self.txn.abort()
            self.env.close()
        finally:
            self.flush.close()


class _Writeback:
    """Starts the kernel writing a file's dirty pages to disk now, without waiting.

    Below the kernel's dirty-page threshold (10% of memory by default) nothing reaches the
    disk until the final fsync, which then writes the whole LMDB while the pack waits;
    started after each commit, the disk writes overlap reading and checking the next
    images (Linux's sync_file_range; elsewhere the fsync at the end does it all).
    """

    def __init__(self, path: Path) -> None:
        self.fd, self.call = -1, None
        with contextlib.suppress(OSError, AttributeError):
            call = _libc().sync_file_range
            call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            self.fd, self.call = os.open(path, os.O_RDONLY), call

    def start(self) -> int | None:
        """sync_file_range's result (0: started), None where there is none; a failure
        only costs speed, the fsync at the end writes what is left."""
        if self.call is None:
            return None
        return self.call(self.fd, 0, 0, _SYNC_FILE_RANGE_WRITE)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library's symbols, through the process's own (dlopen of NULL): no
    ``ctypes.util.find_library``, which imports subprocess and runs ``ldconfig`` at every
    pack job's start."""
    return ctypes.CDLL(None)


def _keep_freed_memory() -> None:
    """Ask glibc to keep freed memory for reuse instead of returning it to the kernel.

    Every transaction frees its ~txn_bytes of LMDB page buffers and image buffers at once;
    by default glibc hands them back and the next transaction faults them in again page by
    page, which measured 2-4x slower packing here. No effect off glibc (macOS).
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = _libc()
        libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # glibc's upper limit: images come from the heap


def pack_lmdb(
    listing: SplitListing,
    out_dir: str | os.PathLike,
    report_path: str | os.PathLike,
    *,
    meta: dict[str, Any] | None = None,
    on_bad_image: str = "fail",
    check: str = "header",
    threads: int = 4,
    txn_bytes: int = TXN_BYTES,
    map_size: int = 1 << 30,
    read_ahead_bytes: int = READ_AHEAD_BYTES,
) -> dict[str, Any]:
    """Write the images of ``listing`` into the LMDB directory ``out_dir``; return the report.

    ``on_bad_image``: ``fail`` raises BadInputError naming the bad files (nothing is left
    behind); ``skip`` leaves them out and lists them in the report (JSON at
    ``report_path``: counts, sizes, time, and ``skipped``: path, kind, message).
    ``read_ahead_bytes``: how far the readers may run ahead of the writer, beyond the
    minimum of ``threads`` x 4 chunks of images: two transactions by default, so that
    they go on reading while the writer commits (13% faster packing, docs/measurements/vision.md).
    """
    if on_bad_image not in ("fail", "skip"):
        raise ValueError(f"on_bad_image must be fail or skip, not '{on_bad_image}'")
    if check not in CHECKS:
        raise ValueError(f"check must be one of {', '.join(CHECKS)}, not '{check}'")
    problems = list(listing.problems)
    if problems and on_bad_image == "fail":
        raise BadInputError(format_problems(problems, "problems in the image tree"))
    samples = [s for s in listing.samples if s.key not in listing.excluded]
    _keep_freed_memory()
    start = time.monotonic()
    count = num_bytes = 0
    out_dir = Path(out_dir)
    progress = Progress(f"pack {out_dir.name}", len(samples), "images")
    tmp_dir = temporary_path(out_dir)
    with atomic_path(report_path) as tmp_report:  # renamed last, after the LMDB
        shutil.rmtree(tmp_dir, ignore_errors=True)  # left by a killed run
        tmp_dir.mkdir(parents=True)
        try:
            writer = _Writer(tmp_dir, map_size, txn_bytes)
            ok = False
            # The header check is Pillow's marker parser, Python code: in the reader threads
            # it holds the GIL against the writer and the other readers, which measured
            # ~10% slower packing than running it here. A full decode is C that releases
            # the GIL, so it stays in the readers, in parallel.
            readers_check = check if check == "decode" else None
            try:
                for sample, record, size, problem in _read_ahead(
                    samples, readers_check, threads, read_ahead_bytes
                ):
                    if record is not None and readers_check is None:
                        problem = image_problem(memoryview(record)[len(record) - size :], check)
                    if problem:
                        bad = Problem(str(sample.path), "bad_image", problem)
                        if on_bad_image == "fail":
                            raise BadInputError(format_problems([bad], "bad image"))
                        log.warning("skipping %s", bad)
                        problems.append(bad)
                        continue
                    writer.put(record_key(count), record)
                    count += 1
                    num_bytes += size
                    progress.update(count)
                progress.finish(count)
                if count == 0:
                    raise BadInputError(f"no usable images among the {len(samples)} listed")
                full_meta = {
                    **(meta or {}),
                    "format": FORMAT,
                    "version": VERSION,
                    "num_samples": count,
                    "num_bytes": num_bytes,
                    "classes": listing.classes,
                }
                writer.put(META_KEY, json.dumps(full_meta).encode())
                ok = True
            finally:
                writer.close(sync=ok)
            seconds = time.monotonic() - start
            report = {
                **(meta or {}),
                "num_samples": count,
                "num_classes": len(listing.classes),
                "num_bytes": num_bytes,
                "lmdb_bytes": (tmp_dir / "data.mdb").stat().st_size,
                "seconds": round(seconds, 3),
                "map_grown": writer.grown,
                "on_bad_image": on_bad_image,
                "check": check,
                "num_skipped": len(problems),
                "skipped": [
                    {"path": p.path, "kind": p.kind, "message": p.message} for p in problems
                ],
            }
            Path(tmp_report).write_text(json.dumps(report, indent=1) + "\n")
            replace_dir(tmp_dir, out_dir)
        except lmdb.Error as e:
            # LMDB reports a full file system as an I/O error of its commit or sync
            full = _disk_full(e, tmp_dir, out_dir, num_bytes, count, len(samples), txn_bytes)
            shutil.rmtree(tmp_dir, ignore_errors=True)
            if full is not None:
                raise full from e
            raise
        except BaseException:
            shutil.rmtree(tmp_dir, ignore_errors=True)
            raise
    log.info(
        "packed %d images (%.1f MB) into %s in %.1f s (%.0f images/s), %d skipped",
        count, num_bytes / 1e6, out_dir, seconds, count / max(seconds, 1e-9), len(problems),
    )  # fmt: skip
    return report
