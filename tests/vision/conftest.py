"""Fixtures of the vision tests: small generated trees of real JPEGs."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcllm.vision.sample_data import write_sample_tree


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
