"""Stage-in to node-local storage: verified copy, free-space check, removal, the command hook."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from hpcllm.vision import stage_in as stage
from hpcllm.vision.lmdb_dataset import LMDBImageDataset


def test_stage_in_copies_and_verifies(packed, tmp_path):
    copy = stage.stage_in(packed / "train.lmdb", tmp_path, reserve_bytes=0)
    assert copy == tmp_path / "imagenet" / "train.lmdb"
    assert (copy / "data.mdb").read_bytes() == (packed / "train.lmdb" / "data.mdb").read_bytes()
    original, staged = LMDBImageDataset(packed / "train.lmdb"), LMDBImageDataset(copy)
    assert [staged.read_record(i) for i in range(len(staged))] == [
        original.read_record(i) for i in range(len(original))
    ]
    assert not list(tmp_path.rglob("*.incomplete"))


def test_staged_removes_the_copies_also_on_error(packed, tmp_path):
    with pytest.raises(RuntimeError, match="training failed"):
        with stage.staged(
            [packed / "train.lmdb", packed / "val.lmdb"], tmp_path, reserve_bytes=0
        ) as copies:
            assert [c.name for c in copies] == ["train.lmdb", "val.lmdb"]
            assert all((c / "data.mdb").is_file() for c in copies)
            raise RuntimeError("training failed")
    assert list(tmp_path.iterdir()) == []


def test_insufficient_space_is_refused_before_copying(packed, tmp_path):
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(stage.StageInError) as err:
        with stage.staged([packed / "train.lmdb"], tmp_path, reserve_bytes=free):
            pass
    message = str(err.value)
    assert str(tmp_path) in message and "GB free" in message and "node-local path" in message
    assert list(tmp_path.iterdir()) == []


def test_missing_destination_is_explained(packed, tmp_path):
    with pytest.raises(stage.StageInError, match=r"does not exist \(an unset variable"):
        stage.stage_in(packed / "train.lmdb", tmp_path / "$TMPDIR")


def test_a_bad_copy_is_detected_and_removed(packed, tmp_path, monkeypatch):
    real_copy = stage._copy_with_crc

    def copy_then_damage(src, dst):  # a bit flipped on the way, as a failing disk would
        crc = real_copy(src, dst)
        with open(dst, "r+b") as f:
            f.seek(5000)
            byte = f.read(1)
            f.seek(5000)
            f.write(bytes([byte[0] ^ 1]))
        return crc

    monkeypatch.setattr(stage, "_copy_with_crc", copy_then_damage)
    with pytest.raises(stage.StageInError, match="differs from the source"):
        stage.stage_in(packed / "train.lmdb", tmp_path, reserve_bytes=0)
    assert list(tmp_path.rglob("*.mdb")) == []


def test_command_hook_runs_with_the_copies_and_removes_them(packed, tmp_path):
    script = (
        "import os; from hpcllm.vision.lmdb_dataset import LMDBImageDataset as D; "
        "paths = os.environ['HPCLLM_STAGED_LMDB'].split(os.pathsep); "
        "print('COUNTS', [len(D(p)) for p in paths], paths[0]); raise SystemExit(3)"
    )
    cmd = [
        sys.executable,
        "-m",
        "hpcllm.vision.stage_in",
        "--dest",
        str(tmp_path),
        "--reserve-gb",
        "0",
    ]
    proc = subprocess.run(
        [
            *cmd,
            str(packed / "train.lmdb"),
            str(packed / "val.lmdb"),
            "--",
            sys.executable,
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 3, proc.stderr  # the command's exit status
    assert f"COUNTS [12, 6] {tmp_path}/imagenet/train.lmdb" in proc.stdout
    assert list(tmp_path.iterdir()) == []
    proc = subprocess.run([*cmd, str(packed / "train.lmdb")], capture_output=True, text=True)
    assert proc.returncode == 2 and "after --" in proc.stderr
