"""The test cluster itself: two idle nodes that run one task each."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slurm


def test_two_idle_nodes_run_one_task_each(cluster):
    assert cluster.node_states() == {"n1": "idle", "n2": "idle"}
    out = cluster.run("srun", "-N2", "-n2", "bash", "-c", "echo $SLURMD_NODENAME", timeout=60)
    assert sorted(out.split()) == ["n1", "n2"]


def test_a_stopped_node_goes_down_and_comes_back(cluster):
    cluster.stop_node("n2")
    assert not cluster.node_alive("n2")
    cluster.wait_nodes("down", nodes=["n2"], timeout=60)
    cluster.restore()
    assert cluster.node_states() == {"n1": "idle", "n2": "idle"}
