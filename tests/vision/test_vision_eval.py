"""Distributed validation reads every val image exactly once across ranks, and the job's
energy is the sum over every rank's GPU: two real gloo ranks on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from hpcllm.bench.energy import job_energy, physical_index
from hpcllm.vision.evaluate import ShardSampler, evaluate
from hpcllm.vision.lmdb_dataset import LMDBImageDataset
from hpcllm.vision.lmdb_pack import pack_lmdb
from hpcllm.vision.sample_data import write_sample_tree
from hpcllm.vision.transforms import ValTransform
from hpcllm.vision.trees import list_split

VAL_IMAGES = 7  # not a multiple of the 2 ranks: a padding sampler would read one twice


class Logged(LMDBImageDataset):
    """The val dataset, noting the index of every image read (in this process)."""

    read: list[int] = []

    def __getitem__(self, index):
        Logged.read.append(index)
        return super().__getitem__(index)


def model() -> torch.nn.Module:
    """A small fixed classifier (any model will do: the point is which images are read)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 7),
    )


def _rank(rank: int, world: int, val: str, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    data = Logged(val, ValTransform(32))
    loader = DataLoader(data, batch_size=2, sampler=ShardSampler(len(data), rank, world))
    result = evaluate(model(), loader, torch.device("cpu"))
    read = [None] * world
    dist.all_gather_object(read, Logged.read)
    energy = {
        "all": job_energy(10.0 * (rank + 1)),
        "one_missing": job_energy(None if rank == 1 else 5.0),
    }
    if rank == 0:
        Path(out).write_text(json.dumps({"result": result, "read": read, "energy": energy}))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def val_lmdb(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eval")
    tree = write_sample_tree(
        root / "tree",
        "imagenet",
        classes=VAL_IMAGES,
        train_per_class=1,
        val_per_class=1,
        size=(48, 40),
        val_labels="folders",
    )
    pack_lmdb(list_split(tree, "imagenet", "val"), root / "val.lmdb", root / "val.json")
    return root / "val.lmdb"


@pytest.fixture(scope="module")
def two_ranks(val_lmdb, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("ranks")
    out = tmp / "out.json"
    mp.spawn(_rank, args=(2, str(val_lmdb), f"file://{tmp / 'rendezvous'}", str(out)), nprocs=2)
    return json.loads(out.read_text())


def test_two_ranks_read_every_val_image_exactly_once(two_ranks, val_lmdb):
    first, second = two_ranks["read"]
    assert sorted(first + second) == list(range(VAL_IMAGES))
    assert abs(len(first) - len(second)) == 1
    assert two_ranks["result"]["val_images"] == VAL_IMAGES
    # the accuracy over the ranks is that of the whole split, read in one process
    data = LMDBImageDataset(val_lmdb, ValTransform(32))
    alone = evaluate(model(), DataLoader(data, batch_size=3), torch.device("cpu"))
    assert alone["val_images"] == VAL_IMAGES
    for key in ("val_top1", "val_top5", "val_loss"):
        assert two_ranks["result"][key] == pytest.approx(alone[key], rel=1e-5), key
    assert 0 <= alone["val_top1"] <= alone["val_top5"] <= 1


def test_job_energy_sums_every_rank_and_is_empty_if_one_has_no_counter(two_ranks):
    assert two_ranks["energy"] == {"all": 30.0, "one_missing": None}
    assert job_energy(12.5) == 12.5  # a single process: its own GPU


def test_energy_counter_reads_the_gpu_the_rank_was_given():
    assert physical_index(0, "2") == 2  # one GPU per task: torch's 0 is the node's GPU 2
    assert physical_index(1, "0,3") == 3
    assert physical_index(3, "") == 3  # all visible
