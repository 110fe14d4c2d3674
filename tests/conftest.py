"""Fixtures shared by all tests; the helpers behind them are in support.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import REPO, make_workdir


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return make_workdir(tmp_path / "work")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
