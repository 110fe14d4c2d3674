"""Read an LMDB written by ``pack_lmdb`` as a PyTorch Dataset.

The environment is opened lazily in the process that reads (each DataLoader worker, each
DDP rank; the dataset object holds only the path, so it pickles for spawned workers),
read-only, without a lock file (the LMDB is never written once packed, and
node-local or read-only copies cannot hold one) and without readahead (random access).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image
from torch.utils.data import Dataset

from hpcllm.vision.lmdb_env import read_meta, shared_environment
from hpcllm.vision.lmdb_pack import RECORD_HEADER, record_key


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
        self.path = Path(path).resolve()
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
        with shared_environment(self.path, resolved=True).begin(buffers=True) as txn:
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
