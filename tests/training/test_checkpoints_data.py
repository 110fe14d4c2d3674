"""Checkpoint discovery and the data checks (splits, vocabulary, paths)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcllm.training.checkpoints import tracker as checkpoints
from hpcllm.training.checkpoints.tracker import CheckpointError
from hpcllm.training.plan.data import Blend, DataError, check_splits, split_document_counts


def test_fresh_directory_starts_from_scratch(tmp_path):
    assert checkpoints.latest_iteration(tmp_path / "none") is None
    assert checkpoints.latest_iteration(tmp_path) is None


def test_commit_marker_written_last(tmp_path):
    tmp = checkpoints.begin_iteration_dir(tmp_path, 20)
    (tmp / "mp_rank_00").mkdir()
    assert checkpoints.iteration_dirs(tmp_path) == []  # the temporary name is no checkpoint
    checkpoints.finish_iteration_dir(tmp_path, 20)
    assert checkpoints.latest_iteration(tmp_path) == 20
    assert (tmp_path / "iter_0000020").is_dir()


def test_a_save_killed_at_its_commit_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    """The tracker is the commit marker, written after the iter_* directory is in place:
    a save killed before its directory is renamed leaves the tracker on the previous one."""

    def save(iteration):
        tmp = checkpoints.begin_iteration_dir(tmp_path, iteration)
        (tmp / "mp_rank_00").mkdir()
        (tmp / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"state %d" % iteration)
        checkpoints.finish_iteration_dir(tmp_path, iteration)

    save(10)
    real_replace = os.replace

    def killed(src, dst):  # killed while renaming the directory, nothing else
        if Path(dst) == checkpoints.iteration_dir(tmp_path, 20):
            raise KeyboardInterrupt("killed during the rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        save(20)
    assert checkpoints.latest_iteration(tmp_path) == 10
    assert checkpoints.iteration_dirs(tmp_path) == [10]


def test_a_killed_saves_leftover_is_cleared_by_the_next_save(tmp_path):
    tmp = checkpoints.begin_iteration_dir(tmp_path, 30)
    (tmp / "mp_rank_00").mkdir()
    (tmp / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"half")
    again = checkpoints.begin_iteration_dir(tmp_path, 30)
    assert again == tmp and list(again.iterdir()) == []
    assert checkpoints.latest_iteration(tmp_path) is None


@pytest.mark.parametrize(
    ("tracker", "dirs", "message"),
    [
        (None, [100], "no latest_checkpointed_iteration.txt"),
        ("200", [100], "points at iteration 200, but .*iter_0000200 does not exist"),
        ("release", [100], "not an iteration number"),
        ("", [], "not an iteration number"),
    ],
)
def test_corrupt_or_partial_checkpoint_dirs(tmp_path, tracker, dirs, message):
    for it in dirs:
        (tmp_path / f"iter_{it:07d}").mkdir()
    if tracker is not None:
        (tmp_path / checkpoints.TRACKER).write_text(tracker)
    with pytest.raises(CheckpointError, match=message):
        checkpoints.latest_iteration(tmp_path)


def test_split_document_counts_round_like_megatron():
    assert split_document_counts(27, "949,50,1") == [26, 1, 0]
    assert split_document_counts(1000, "949,50,1") == [949, 50, 1]
    assert split_document_counts(10, "98,2,0") == [10, 0, 0]


def test_split_without_documents_is_refused_instead_of_hanging(data_prefixes):
    blend = Blend((data_prefixes[2],), None)  # fineweb: 27 documents
    with pytest.raises(DataError, match="gives the test split none of them"):
        check_splits(blend, "949,50,1", [100, 0, 0])
    with pytest.raises(DataError, match="valid split none of them"):
        check_splits(blend, "99,0.5,0.5", [100, 0, 0])
    with pytest.raises(DataError, match="no share, but 8 valid samples"):
        check_splits(blend, "98,0,2", [100, 8, 0])
    check_splits(blend, "90,10,0", [100, 8, 0])


def test_bad_split_strings():
    with pytest.raises(DataError, match="not a comma-separated list"):
        split_document_counts(10, "a,b")
    with pytest.raises(DataError, match="up to three"):
        split_document_counts(10, "1,1,1,1")


def test_megatron_samples_span_documents(data_prefixes, vocab_file, tmp_path):
    """seq_length + 1 tokens per sample, labels shifted by one, from the real files."""
    import torch.distributed as dist

    from hpcllm.training.plan.data import build_datasets

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        train, valid, test = build_datasets(
            Blend((data_prefixes[0],), None), "98,2,0", 32, 7, [50, 0, 0], 8000, 0, tmp_path
        )
    finally:
        dist.destroy_process_group()
    assert valid is None and test is None and len(train) >= 50
    sample = train[0]
    assert sample["tokens"].shape == (32,) and sample["labels"].shape == (32,)
    assert (sample["tokens"][1:] == sample["labels"][:-1]).all()

    # The documents as the .bin holds them (Megatron Core's reader): each ends with EOD.
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    stored = IndexedDataset(data_prefixes[0])
    documents = [stored[i].tolist() for i in range(len(stored))]
    eod = documents[0][-1]
    assert all(doc[-1] == eod and eod not in doc[:-1] for doc in documents)
    # A sample whose window crosses an end of document: the tokens up to the EOD are the
    # end of one stored document, those after it the start of another.
    for i in range(len(train)):
        window = train[i]["tokens"].tolist() + [int(train[i]["labels"][-1])]
        if eod in window[:-1]:
            break
    else:
        raise AssertionError("no sample crosses a document boundary")
    cut = window.index(eod) + 1
    head, tail = window[:cut], window[cut:]
    if eod in tail:  # a short next document: compare it up to its own end
        tail = tail[: tail.index(eod) + 1]
    assert any(doc[-len(head) :] == head for doc in documents), head
    assert any(doc[: len(tail)] == tail for doc in documents), tail
