"""Stage-in under a short collective timeout: the ranks wait for a slow copy outside the
job's process group (hpcllm.vision.stage_job), with real processes under torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from support import hang_guard

# Each rank: the job's process group with a short timeout (the NCCL group's 10 minutes,
# scaled down), local rank 0's copy slowed beyond it (a slow shared file system), then a
# collective of the job's group and a read of the copy, as training does next.
DRIVER = textwrap.dedent(
    """
    import json, os, sys, time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from hpcllm.vision import stage_job
    from hpcllm.vision.lmdb_dataset import LMDBImageDataset

    lmdb, dest, slow_s, collective_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    stage_timeout = float(sys.argv[5]) if len(sys.argv) > 5 else None
    real_stage_in = stage_job.stage_in

    def slow_stage_in(*args, **kwargs):
        time.sleep(slow_s)
        return real_stage_in(*args, **kwargs)

    stage_job.stage_in = slow_stage_in
    dist.init_process_group("gloo", timeout=timedelta(seconds=collective_s))
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    copies, record, cleanup = stage_job.stage_for_job(
        [lmdb], dest, "copy", rank, local_rank, timeout_s=stage_timeout
    )
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)  # the job's group still works
    images = LMDBImageDataset(copies[0]).num_samples
    cleanup()
    if rank == 0:
        print("RESULT " + json.dumps({**record, "sum": total.item(), "images": images}), flush=True)
    dist.destroy_process_group()
    """
)


def torchrun(tmp_path, *args):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(driver),
        *map(str, args),
    ]
    # A hang guard: about 30 s on a quiet machine (12-20 s of it the slowed copy).
    return subprocess.run(cmd, capture_output=True, text=True, timeout=hang_guard(30))


def test_a_copy_slower_than_the_collective_timeout_still_runs(packed, tmp_path):
    dest = tmp_path / "local"
    dest.mkdir()
    # the copy takes 12 s more; a collective of the job's group would time out after 3 s
    proc = torchrun(tmp_path, packed / "train.lmdb", dest, 12, 3)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    record = json.loads(line.removeprefix("RESULT "))
    (seconds,) = record["seconds_per_node"].values()
    assert seconds >= 12
    assert record["sum"] == 3.0 and record["images"] == 12
    assert record["timeout_s"] >= 600  # sized from the bytes: the margin at least
    assert list(dest.iterdir()) == []  # the copies are removed


def test_a_copy_slower_than_the_stage_in_timeout_fails_saying_so(packed, tmp_path):
    dest = tmp_path / "local"
    dest.mkdir()
    proc = torchrun(tmp_path, packed / "train.lmdb", dest, 20, 3, 4)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "stage-in: waiting for every node's copies failed after at most 4 s" in out, out[-3000:]
    assert "stage_in_timeout_s" in out


@pytest.mark.parametrize(
    ("size", "given", "expected"), [(150e9, None, 3600), (0, None, 600), (1, 42, 42)]
)
def test_stage_timeout_is_sized_to_the_copy(size, given, expected):
    from hpcllm.vision.stage_job import stage_timeout_s

    assert stage_timeout_s(size, given) == pytest.approx(expected)
