"""The session's test Slurm cluster, started once for every test marked ``slurm``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # testcluster, slurmruns

import testcluster  # noqa: E402


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> testcluster.TestCluster:
    """munge, slurmctld and slurmd n1, n2, all idle; everything is stopped afterwards."""
    reason = testcluster.missing_requirements()
    if reason:
        pytest.skip(reason)
    with testcluster.running(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture
def cluster(slurm_cluster: testcluster.TestCluster) -> testcluster.TestCluster:
    """The session's cluster, with both nodes idle and no job left from an earlier test."""
    slurm_cluster.restore()
    return slurm_cluster
