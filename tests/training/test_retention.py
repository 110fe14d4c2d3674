"""keep_checkpoints: older checkpoints go only after a newer one is committed, never the
tracker's, never one being written; a kill during a save or a deletion leaves a loadable
checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from hpcllm.training.checkpoints import tracker as checkpoints
from hpcllm.training.checkpoints.tracker import (
    begin_iteration_dir,
    finish_iteration_dir,
    iteration_dirs,
    latest_iteration,
    prune,
)


def save_checkpoint(save, iteration, size=16):
    tmp = begin_iteration_dir(save, iteration)
    (tmp / "mp_rank_00").mkdir()
    (tmp / "mp_rank_00" / "model_optim_rng.pt").write_bytes(os.urandom(size))
    finish_iteration_dir(save, iteration)


def test_keeps_the_newest_and_every_mth_and_nothing_uncommitted(tmp_path):
    save = tmp_path / "ckpt"
    for it in range(2, 22, 2):
        save_checkpoint(save, it)
    # iteration 22 is being written by Megatron (no temporary name there): above the tracker
    (checkpoints.iteration_dir(save, 22) / "mp_rank_00").mkdir(parents=True)
    assert latest_iteration(save) == 20
    deleted = prune(save, keep_last=2, keep_every=10)
    assert deleted == [2, 4, 6, 8, 12, 14, 16]
    assert iteration_dirs(save) == [10, 18, 20, 22]
    assert latest_iteration(save) == 20 and checkpoints.model_file(save, 20).is_file()
    assert prune(save, keep_last=1) == [10, 18]  # 'every' dropped: kept no more
    assert iteration_dirs(save) == [20, 22]
    assert prune(tmp_path / "fresh", keep_last=1) == []  # nothing committed yet


def test_a_kill_during_a_save_leaves_the_committed_checkpoint(tmp_path):
    """A save killed half-way (its temporary directory, no tracker update) and a prune:
    the tracker's checkpoint stays, and so does the interrupted save for the next one."""
    save = tmp_path / "ckpt"
    for it in (2, 4):
        save_checkpoint(save, it)
    code = (
        "import os, sys, time\n"
        "from hpcllm.training.checkpoints.tracker import begin_iteration_dir\n"
        "tmp = begin_iteration_dir(sys.argv[1], 6)\n"
        "open(tmp / 'partial.pt', 'wb').write(os.urandom(1 << 20))\n"
        "print('writing', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(save)], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"writing\n"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert prune(save, keep_last=1) == [2]
    assert latest_iteration(save) == 4 and checkpoints.model_file(save, 4).is_file()
    save_checkpoint(save, 6)  # the next save replaces the leftover
    assert latest_iteration(save) == 6 and prune(save, keep_last=1) == [4]


def test_a_kill_during_a_deletion_leaves_no_half_deleted_checkpoint(tmp_path, monkeypatch):
    """The process dies while prune removes an old checkpoint (here: the removal raises
    half-way, as a SIGKILL would stop it): the tracker's checkpoint loads, no iter_*
    directory is half gone (the doomed one was renamed in one step first), and the next
    prune removes the leftover."""
    save = tmp_path / "ckpt"
    for it in (2, 4, 6):
        save_checkpoint(save, it)
    real_rmtree = checkpoints.shutil.rmtree

    def dies_half_way(path, *args, **kwargs):
        files = sorted(p for p in Path(path).rglob("*") if p.is_file())
        files[0].unlink()  # some of it is gone
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(checkpoints.shutil, "rmtree", dies_half_way)
    try:
        prune(save, keep_last=1)
    except KeyboardInterrupt:
        pass
    doomed = save / f"iter_0000002{checkpoints.DELETING}"
    assert doomed.exists() and not checkpoints.iteration_dir(save, 2).exists()
    assert iteration_dirs(save) == [4, 6] and latest_iteration(save) == 6
    assert checkpoints.model_file(save, 6).is_file()
    monkeypatch.setattr(checkpoints.shutil, "rmtree", real_rmtree)
    assert prune(save, keep_last=1) == [4]
    assert not doomed.exists() and iteration_dirs(save) == [6]
