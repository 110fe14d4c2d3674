"""The test cluster itself: two idle nodes that run one task each."""

from __future__ import annotations

import pytest
from support import hang_guard

pytestmark = pytest.mark.slurm


def test_two_idle_nodes_run_one_task_each(cluster):
    assert cluster.node_states() == {"n1": "idle", "n2": "idle"}
    out = cluster.run(
        "srun", "-N2", "-n2", "bash", "-c", "echo $SLURMD_NODENAME", timeout=hang_guard(2)
    )
    assert sorted(out.split()) == ["n1", "n2"]


def test_nodes_offer_their_gpus_to_whole_node_jobs(cluster):
    """Each node advertises its GPUs (fake device files); a job asking for all of them
    on both nodes sees them, as on a GPU cluster."""
    from testcluster import GPUS_PER_NODE

    out = cluster.run(
        "srun",
        "-N2",
        "--ntasks-per-node=1",
        f"--gres=gpu:{GPUS_PER_NODE}",
        "bash",
        "-c",
        'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"',
        timeout=hang_guard(2),  # ~2 s quiet
    )
    devices = ",".join(str(i) for i in range(GPUS_PER_NODE))
    assert sorted(out.splitlines()) == [f"n1 {devices}", f"n2 {devices}"]
