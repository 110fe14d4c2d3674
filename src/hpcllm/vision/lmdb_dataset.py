"""Read an LMDB written by ``pack_lmdb`` as a PyTorch Dataset.

The environment is opened lazily in the process that reads (each DataLoader worker, each
DDP rank; the dataset object holds only the path, so it pickles for spawned workers),
read-only, without a lock file (the LMDB is never written once packed, and
node-local or read-only copies cannot hold one) and without readahead (random access).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
from PIL import Image
from torch.utils.data import Dataset

from hpcllm.vision.lmdb_pack import FORMAT, META_KEY, RECORD_HEADER, VERSION, record_key


def open_readonly(path: str | os.PathLike) -> lmdb.Environment:
    path = Path(path)
    if not (path / "data.mdb").is_file():
        raise FileNotFoundError(f"{path}: not an LMDB directory (no data.mdb); run pack_lmdb")
    return lmdb.open(
        str(path), readonly=True, lock=False, readahead=False, meminit=False, max_readers=512
    )


# One environment per LMDB and process: py-lmdb refuses to open the same files twice in a
# process, so every dataset over a path shares it. A forked DataLoader worker inherits the
# parent's entries; it closes them (its own mapping only) and opens its own.
_ENVIRONMENTS: dict[Path, tuple[int, lmdb.Environment]] = {}


def shared_environment(path: str | os.PathLike) -> lmdb.Environment:
    key = Path(path).resolve()
    pid, env = _ENVIRONMENTS.get(key, (None, None))
    if env is not None and pid == os.getpid():
        return env
    if env is not None:
        env.close()
    env = open_readonly(key)
    _ENVIRONMENTS[key] = (os.getpid(), env)
    return env


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The LMDB's metadata: ``num_samples``, ``classes`` and the rest (see lmdb_pack)."""
    with shared_environment(path).begin() as txn:
        raw = txn.get(META_KEY)
    if raw is None:
        raise ValueError(f"{path}: no {META_KEY.decode()} record; not written by pack_lmdb")
    meta = json.loads(raw)
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(
            f"{path}: format {meta.get('format')} version {meta.get('version')}, expected "
            f"{FORMAT} version {VERSION}; repack it"
        )
    return meta


class LMDBImageDataset(Dataset):
    """``(image, label)`` pairs; the image is a Pillow RGB image passed through ``transform``.

    ``repeat``: every image appears ``repeat`` times per epoch (index i reads image
    ``i % num_samples``), e.g. 13 for TinyImageNet-200 to match ImageNet's epoch length.
    Works with DataLoader workers (fork or spawn) and DistributedSampler.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        transform: Callable[[Image.Image], Any] | None = None,
        repeat: int = 1,
    ) -> None:
        if repeat < 1:
            raise ValueError(f"repeat must be at least 1, not {repeat}")
        self.path = Path(path)
        self.transform = transform
        self.repeat = repeat
        self.meta = read_meta(self.path)
        self.classes: list[str] = self.meta["classes"]
        self.num_samples: int = self.meta["num_samples"]

    def __len__(self) -> int:
        return self.num_samples * self.repeat

    def read_record(self, index: int) -> tuple[bytes, int, str]:
        """The encoded image bytes, the label and the source path of image ``index``."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        with shared_environment(self.path).begin(buffers=True) as txn:
            value = txn.get(record_key(index % self.num_samples))
            if value is None:
                raise KeyError(f"{self.path}: record {index % self.num_samples} missing")
            label, name_len = RECORD_HEADER.unpack_from(value)
            start = RECORD_HEADER.size
            name = bytes(value[start : start + name_len]).decode("utf-8")
            return bytes(value[start + name_len :]), label, name

    def __getitem__(self, index: int) -> tuple[Any, int]:
        data, label, _ = self.read_record(index)
        image = Image.open(io.BytesIO(data)).convert("RGB")
        return (self.transform(image) if self.transform else image), label
