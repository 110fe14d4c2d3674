"""Open plain or compressed files by their suffix, as binary streams."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
from typing import BinaryIO

import zstandard


class _ZstdReader:
    """A zstd decompressing reader that also closes the file under it."""

    def __init__(self, path: str | os.PathLike):
        self._file = open(path, "rb")
        self._reader = zstandard.ZstdDecompressor().stream_reader(self._file, read_size=1 << 20)

    def __getattr__(self, name):
        return getattr(self._reader, name)

    def close(self) -> None:
        self._reader.close()
        self._file.close()

    def __enter__(self):
        return self._reader

    def __exit__(self, *exc) -> None:
        self.close()


def open_binary(path: str | os.PathLike) -> BinaryIO:
    """A readable binary stream of the decompressed content of ``path``."""
    name = str(path)
    if name.endswith(".zst"):
        return _ZstdReader(path)  # type: ignore[return-value]
    if name.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if name.endswith(".xz"):
        return lzma.open(path, "rb")  # type: ignore[return-value]
    if name.endswith(".bz2"):
        return bz2.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")
