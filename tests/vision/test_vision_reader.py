"""The LMDB reader: repeat factor, DataLoader workers (fork and spawn), DistributedSampler, DDP."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from vision_helpers import expected_labels

from hpcllm.vision.lmdb_dataset import LMDBImageDataset
from hpcllm.vision.lmdb_pack import pack_lmdb
from hpcllm.vision.trees import list_split


def to_tensor(image):
    return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)


@pytest.fixture(scope="module")
def tiny_lmdb(tiny_tree, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lmdb")
    pack_lmdb(list_split(tiny_tree, "tinyimagenet", "train"), out / "train.lmdb", out / "r.json")
    return out / "train.lmdb"


@pytest.fixture(scope="module")
def truth(tiny_lmdb, tiny_tree) -> list[int]:
    """Label of each record index, from the source tree."""
    ds = LMDBImageDataset(tiny_lmdb)
    wnids = expected_labels(tiny_tree, "tinyimagenet", "train")
    return [ds.classes.index(wnids[ds.read_record(i)[2]]) for i in range(ds.num_samples)]


def test_repeat_factor(tiny_lmdb, truth):
    n = len(truth)
    ds = LMDBImageDataset(tiny_lmdb, transform=to_tensor, repeat=13)
    assert len(ds) == 13 * n
    assert [ds[i][1] for i in range(len(ds))] == truth * 13
    assert torch.equal(ds[5 + 7 * n][0], ds[5][0])
    assert ds.read_record(-1)[0] == ds.read_record(n - 1)[0]
    with pytest.raises(IndexError):
        ds[13 * n]
    counts = Counter(ds.read_record(int(i))[2] for i in torch.randperm(len(ds)))
    assert set(counts.values()) == {13} and len(counts) == n
    with pytest.raises(ValueError, match="repeat"):
        LMDBImageDataset(tiny_lmdb, repeat=0)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers(tiny_lmdb, truth, context):
    ds = LMDBImageDataset(tiny_lmdb, transform=to_tensor, repeat=2)
    ds[0]  # the parent's environment must not be what the workers use
    loader = DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context=context)
    images, labels = zip(*loader)
    assert torch.cat(labels).tolist() == truth * 2
    assert torch.equal(torch.cat(images)[3], ds[3][0])
    assert pickle.loads(pickle.dumps(ds))[7][1] == truth[7]


def test_distributed_sampler_splits_the_epoch(tiny_lmdb, truth):
    ds = LMDBImageDataset(tiny_lmdb, transform=to_tensor, repeat=3)
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=1)
        sampler.set_epoch(4)
        indices = list(sampler)
        loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2)
        labels = torch.cat([y for _, y in loader]).tolist()
        assert labels == [truth[i % len(truth)] for i in indices]
        seen += indices
    assert sorted(seen) == list(range(len(ds)))


def _ddp_rank(rank: int, world: int, path: str, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    ds = LMDBImageDataset(path, transform=to_tensor)
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=3, sampler=sampler, num_workers=1)
    pairs = [
        (int(i), int(y))
        for i, (_, y) in zip(sampler, [(x, y) for xb, yb in loader for x, y in zip(xb, yb)])
    ]
    gathered = [None] * world
    dist.all_gather_object(gathered, pairs)
    if rank == 0:
        Path(out).write_text(repr(sorted(p for part in gathered for p in part)))
    dist.destroy_process_group()


def test_ddp_ranks_read_every_image_once(tiny_lmdb, truth, tmp_path):
    out = tmp_path / "pairs.txt"
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.spawn(_ddp_rank, args=(2, str(tiny_lmdb), init, str(out)), nprocs=2)
    assert eval(out.read_text()) == list(enumerate(truth))


def test_two_datasets_over_one_lmdb(tiny_lmdb, truth):
    first, second = LMDBImageDataset(tiny_lmdb), LMDBImageDataset(tiny_lmdb, repeat=2)
    assert first[1][1] == second[1][1] == truth[1]


def test_not_an_lmdb_is_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="no data.mdb"):
        LMDBImageDataset(tmp_path)
