"""The test cluster itself: two idle nodes that run one task each."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slurm


def test_two_idle_nodes_run_one_task_each(cluster):
    assert cluster.node_states() == {"n1": "idle", "n2": "idle"}
    out = cluster.run("srun", "-N2", "-n2", "bash", "-c", "echo $SLURMD_NODENAME", timeout=60)
    assert sorted(out.split()) == ["n1", "n2"]
