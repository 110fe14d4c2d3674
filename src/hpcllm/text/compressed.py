"""Open plain or compressed files as binary streams, recognised by their magic bytes.

Every compressed stream is read to its end marker: a file cut short (a download that
stopped, a copy that ran out of quota) raises :class:`CorruptInput` naming the file,
never a silent half. The zstandard stream reader returns an incomplete last frame as a
clean end of file, so zstd is decoded frame by frame here and the last frame checked.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
from typing import BinaryIO

import zstandard

# Magic bytes of each format: a mislabelled file (gzip bytes named .jsonl) is still read.
MAGIC = {
    "zst": b"\x28\xb5\x2f\xfd",
    "gz": b"\x1f\x8b",
    "xz": b"\xfd7zXZ\x00",
    "bz2": b"BZh",
}
CHUNK = 1 << 20


class CorruptInput(ValueError):
    """A compressed input that is truncated or corrupt; the message names the file."""


def compression_of(path: str | os.PathLike) -> str | None:
    """``zst``, ``gz``, ``xz``, ``bz2`` by the file's first bytes, or None for plain data."""
    with open(path, "rb") as f:
        head = f.read(8)
    return next((fmt for fmt, magic in MAGIC.items() if head.startswith(magic)), None)


class _ZstdFrames(io.RawIOBase):
    """zstd decoded one frame after another; an unfinished last frame is an error."""

    def __init__(self, file: BinaryIO):
        self._file = file
        self._dctx = zstandard.ZstdDecompressor()
        self._obj = self._dctx.decompressobj()
        self._in_frame = False  # bytes of a frame fed that has not ended yet
        self._pending = b""
        self._eof = False

    def readable(self) -> bool:
        return True

    def _feed(self, data: bytes) -> None:
        while data:
            self._in_frame = True
            out = self._obj.decompress(data)
            self._pending += out
            if not self._obj.eof:
                return
            # The frame ended: what follows it is the next frame (or padding).
            data = self._obj.unused_data
            self._obj = self._dctx.decompressobj()
            self._in_frame = False

    def readinto(self, buffer) -> int:
        while not self._pending and not self._eof:
            data = self._file.read(CHUNK)
            if not data:
                self._eof = True
                if self._in_frame:
                    raise EOFError("the last zstd frame ends before its end marker")
                break
            self._feed(data)
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


class _Named(io.RawIOBase):
    """Decoding errors of the stream under it, re-raised with the file's name; ``disk``:
    the compressed file it reads, closed with it."""

    def __init__(self, inner, path: str | os.PathLike, fmt: str, disk: BinaryIO):
        self._inner, self._path, self._fmt, self.disk = inner, os.fspath(path), fmt, disk

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            return self._inner.readinto(buffer)
        except (EOFError, OSError, lzma.LZMAError, zstandard.ZstdError) as e:
            raise CorruptInput(
                f"{self._path}: truncated or corrupt {self._fmt} data ({e}); "
                "download or copy the file again"
            ) from None

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self.disk.close()
            super().close()


def open_binary(path: str | os.PathLike) -> BinaryIO:
    """A readable, buffered binary stream of the decompressed content of ``path``.

    The format comes from the first bytes; a suffix that promises compression the bytes
    do not have (``.zst`` holding plain text) is an error naming the file.
    """
    fmt = compression_of(path)
    name = os.fspath(path)
    claimed = next((s for s in MAGIC if name.endswith(f".{s}")), None)
    if claimed and fmt is None:
        raise CorruptInput(
            f"{name}: named .{claimed} but does not start with {claimed}'s magic bytes; "
            "it is not a complete compressed file (rename it or download it again)"
        )
    disk = open(path, "rb")
    if fmt is None:
        return disk
    try:
        if fmt == "zst":
            inner: io.RawIOBase = _ZstdFrames(disk)
        elif fmt == "gz":
            inner = gzip.open(disk, "rb")  # type: ignore[assignment]
        elif fmt == "xz":
            inner = lzma.open(disk, "rb")  # type: ignore[assignment]
        else:
            inner = bz2.open(disk, "rb")  # type: ignore[assignment]
    except BaseException:
        disk.close()
        raise
    return io.BufferedReader(_Named(inner, path, fmt, disk), CHUNK)  # type: ignore[return-value]


def disk_position(stream: BinaryIO) -> int:
    """How far into its file ``stream`` (from :func:`open_binary`) has read: for a
    compressed file, in compressed bytes (decoded a chunk ahead of what was returned)."""
    raw = getattr(stream, "raw", None)
    return raw.disk.tell() if isinstance(raw, _Named) else stream.tell()
