"""Fixtures of the vision tests: small generated trees of real JPEGs."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcllm.vision.lmdb_pack import pack_lmdb
from hpcllm.vision.sample_data import write_sample_tree
from hpcllm.vision.trees import list_split


@pytest.fixture(scope="session")
def imagenet_tree(tmp_path_factory) -> Path:
    return write_sample_tree(
        tmp_path_factory.mktemp("trees") / "imagenet",
        "imagenet",
        classes=3,
        train_per_class=4,
        val_per_class=2,
    )


@pytest.fixture(scope="session")
def tiny_tree(tmp_path_factory) -> Path:
    return write_sample_tree(
        tmp_path_factory.mktemp("trees") / "tiny",
        "tinyimagenet",
        classes=3,
        train_per_class=4,
        val_per_class=2,
    )


@pytest.fixture(scope="session")
def packed(imagenet_tree, tmp_path_factory) -> Path:
    """``imagenet_tree`` packed as the workflow does: data/vision/imagenet/{train,val}.lmdb
    (read only by the tests)."""
    out = tmp_path_factory.mktemp("data") / "vision" / "imagenet"
    for split in ("train", "val"):
        listing = list_split(
            imagenet_tree,
            "imagenet",
            split,
            {"format": "loc_solution_csv", "file": "LOC_val_solution.csv"},
        )
        pack_lmdb(listing, out / f"{split}.lmdb", out / f"{split}.report.json")
    return out
