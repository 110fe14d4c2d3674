"""Fixtures shared by all tests; the helpers behind them are in support.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import REPO, make_workdir

from hpcllm.models.megatron_args import MEGATRON_LM_RELEASE

# The pin's Megatron-LM tree (pretrain_gpt.py, the dataset helpers' Makefile: not in the
# release's wheel) where MEGATRON_LM_DIR names none: the reference copy beside the
# project (../shared/reference/, read-only: tests that build in it copy it first).
# Set before the test modules are imported, which read it there.
SHARED_MEGATRON_LM = (
    Path(__file__).resolve().parents[2]
    / "shared"
    / "reference"
    / f"megatron-lm-{MEGATRON_LM_RELEASE}"
)


def pytest_configure(config) -> None:
    found = (SHARED_MEGATRON_LM / "pretrain_gpt.py").is_file()
    if found and "MEGATRON_LM_DIR" not in os.environ:  # set and empty: no tree
        os.environ["MEGATRON_LM_DIR"] = str(SHARED_MEGATRON_LM)


@pytest.fixture(scope="session", autouse=True)
def _session_working_directory(tmp_path_factory) -> Iterator[None]:
    """Session and module fixtures run outside the checkout too (see below)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("session-cwd"))
        yield


@pytest.fixture(autouse=True)
def _own_working_directory(tmp_path_factory, monkeypatch) -> None:
    """Every test starts in an empty folder of its own, not in the checkout: what a
    workflow run left there (data/, results/, logs/, checkpoints/, .snakemake/ after
    `make run`) must not change a test's outcome, and a test must not write there.
    Tests that need the checkout's files name them through ``REPO``."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return make_workdir(tmp_path / "work")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(autouse=True)
def _no_process_group_left_behind(request) -> Iterator[None]:
    """A test that runs torch.distributed in this process must end its process group:
    one left behind makes the next test's init_process_group fail ("initialize the
    default process group twice"), far from its cause. Said here, at the test that left it."""
    yield
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        pytest.fail(f"{request.node.nodeid} left a torch.distributed process group behind")


# The suite runs on several pytest-xdist workers (`make test`: --dist loadgroup), since it
# mostly waits (Slurm jobs, Snakemake runs). Two rules keep that cheap and balanced:
# - the tests that use a module-scoped fixture run on one worker, so it is made once (a
#   module that shares a session fixture of its own marks its tests with xdist_group);
# - the long tests (Slurm, then Snakemake runs) are handed out first, so that none of
#   them starts last and alone.
@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if uses_a_module_fixture(item) and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    items.sort(
        key=lambda item: (
            not item.get_closest_marker("slurm"),
            not item.get_closest_marker("workflow"),
        )
    )


def uses_a_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(
        fixturedef.scope == "module"
        for name in info.names_closure
        for fixturedef in info.name2fixturedefs.get(name, ())
    )


def pytest_collection_finish(session) -> None:
    """xdist sends a group's tests to one worker by a suffix of their node ids; a pytest
    or xdist release that drops it would spread them silently (pytest-xdist issue 1386)."""
    if not session.config.getoption("loadgroup", False):
        return  # not an xdist worker of a --dist loadgroup run
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group")]
    lost = [nodeid for nodeid in lost if "@" not in nodeid]
    if lost:
        raise pytest.UsageError(
            f"--dist loadgroup did not group {lost[0]} (and {len(lost) - 1} more): this "
            "pytest-xdist does not work with this pytest (see pyproject.toml's pins)"
        )


# CI runs every Megatron test at the jobs' release (installed by `make`) and with the
# pin's tree (MEGATRON_LM_DIR or SHARED_MEGATRON_LM): a test skipped for lack of either
# there is a test that did not run, so it fails instead.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("CI") == "true" and skipped_for_megatron(report):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped for lack of Megatron, which CI must have ({skip_reason(report)}): "
            "`make` installs the jobs' release (hpcllm.models.megatron_compat); the pin's "
            f"tree is MEGATRON_LM_DIR's or {SHARED_MEGATRON_LM}"
        )


def skip_reason(report) -> str:
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


def skipped_for_megatron(report) -> bool:
    """A skip because Megatron Core is missing or does not import, or because the pin's
    Megatron-LM tree is not there (test_megatron_conformance's needs_tree)."""
    reason = skip_reason(report).lower()
    return (
        "could not import 'megatron" in reason
        or "megatron core is not installed" in reason
        or "needs a megatron-lm tree" in reason
    )
