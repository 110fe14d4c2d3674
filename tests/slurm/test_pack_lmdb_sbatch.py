"""pack_lmdb through real sbatch: the rule's shell command (python -m
hpcllm.vision.pack_job) in a Slurm job, for a user's tree at a path the command quotes."""

from __future__ import annotations

import pytest
import slurmruns
import yaml

from hpcllm.vision.lmdb_dataset import LMDBImageDataset
from hpcllm.vision.sample_data import write_sample_tree

pytestmark = pytest.mark.slurm

# A space and non-ASCII: quotes or backticks in an input path break the Slurm plugin's
# own job script (sh: "Unterminated quoted string"), before this rule's command runs;
# the command's quoting of those is tests/vision/test_vision_workflow.py's.
TREE = "user images é"


def test_a_split_packs_in_a_slurm_job(cluster, tmp_path):
    work = slurmruns.make_workdir(tmp_path / "slurm")
    root = write_sample_tree(work / TREE, "imagenet", classes=2, train_per_class=3, val_per_class=1)
    mine = {"layout": "imagenet", "root": str(root), "splits": ["train"]}
    (work / "mine.yaml").write_text(yaml.safe_dump({"vision": {"datasets": {"mine": mine}}}))
    target = "data/vision/mine/train.lmdb"
    proc = slurmruns.run(work, cluster, "--configfile", "mine.yaml", "--", target)
    remote, _ = slurmruns.rule_headers(proc.stdout + proc.stderr)
    assert remote == {"pack_lmdb": 1}, proc.stdout[-3000:]
    [(job_id, slurm_log)] = slurmruns.slurm_logs(work)["pack_lmdb"]
    job = {j["id"]: j for j in cluster.jobs()}[job_id]
    assert job["state"] == "COMPLETED" and job["cpus"] == "4", job
    # the job's progress lines reach the Slurm job's output, its log the rule's log
    assert "pack train.lmdb: 6 of 6 images (100.0%)" in slurm_log.read_text()
    assert "packed 6 images" in (work / "logs/pack_lmdb/mine/train.log").read_text()
    ds = LMDBImageDataset(work / target)
    assert ds.num_samples == 6
    for i in range(ds.num_samples):
        data, _, name = ds.read_record(i)
        assert data == (root / name).read_bytes()
