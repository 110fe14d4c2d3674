"""benchmarks/stage_in_methods.py runs on the test cluster with a tiny LMDB (no figures
checked), so it does not rot."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from support import REPO

pytestmark = pytest.mark.slurm


def test_stage_in_benchmark_runs_both_methods_on_both_nodes(capsys):
    sys.path.insert(0, str(REPO / "tests" / "slurm"))
    import testcluster

    if testcluster.missing_requirements():
        pytest.skip(testcluster.missing_requirements())
    spec = importlib.util.spec_from_file_location(
        "stage_in_methods", REPO / "benchmarks/stage_in_methods.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(["--mb", "8", "--repeats", "1"])
    for method in ("copy", "sbcast"):
        (run,) = result[method]
        assert sorted(run) == ["n1", "n2"] and all(s > 0 for s in run.values()), result
    out = capsys.readouterr().out
    assert "copy" in out and "sbcast" in out and "slowest node" in out
