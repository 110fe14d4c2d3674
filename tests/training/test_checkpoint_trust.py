"""Checkpoint trust (issue 51, items 5-8): an edited or lost manifest never lets a resume
train on damaged weights; `hpcllm accept-checkpoint` checks what it can before it records
and asks; a garbled manifest or tracker gets a way out that keeps intact weights.

Real checkpoint folders of torch's layout (``mp_rank_00/model_optim_rng.pt`` beside a
``common.pt`` and a ``metadata.json`` that stay the same from one save to the next), the
manifests and segment records written by the package's own functions."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from hpcllm import cli
from hpcllm.training.campaign import records
from hpcllm.training.checkpoints import checksums
from hpcllm.training.checkpoints import tracker as checkpoints
from hpcllm.training.checkpoints.checksums import check_checksums
from hpcllm.training.checkpoints.tracker import CheckpointError
from hpcllm.training.plan.experiment import Paths


def save_checkpoint(save: Path, iteration: int) -> Path:
    """One committed checkpoint, its checksums recorded as the segment records them."""
    folder = checkpoints.iteration_dir(save, iteration)
    (folder / "mp_rank_00").mkdir(parents=True)
    weights = {f"layer{i}.weight": torch.full((64, 64), float(iteration + i)) for i in range(4)}
    torch.save(weights, folder / "mp_rank_00" / "model_optim_rng.pt")
    torch.save({"args": "same every save"}, folder / "common.pt")
    (folder / "metadata.json").write_text('{"sharded_backend": "torch"}\n')
    checkpoints.write_tracker(save, iteration)
    checksums.record_checksums(str(save))
    return folder


def keep_segment_record(tmp_path: Path, save: Path, segment: int, iteration: int) -> Path:
    """The record a segment job keeps in ``<save>/chain`` (records.write_trained), with
    the fields this version writes: the data digest and the checkpoint's checksums."""
    folder = checkpoints.iteration_dir(save, iteration)
    record = {
        "experiment": "x",
        "segment": segment,
        "first_iteration": iteration - 9,
        "last_iteration": iteration,
        "resumed_from_iteration": iteration - 10,
        "checkpoint": str(folder),
        "data_digest": "0" * 32,
        # what run_segment copies from the manifest it recorded
        "checkpoint_checksums": json.loads((folder / checksums.MANIFEST).read_text())["files"],
    }
    paths = Paths(
        save=str(save),
        record=str(tmp_path / "results" / f"seg{segment}.json"),
        engine_log=str(tmp_path / "engine.log"),
        data_cache=str(tmp_path / "cache"),
        tensorboard=str(tmp_path / "tb"),
    )
    Path(paths.record).parent.mkdir(parents=True, exist_ok=True)
    records.write_trained(record, paths)
    return records.kept_path(save, segment)


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def two_checkpoints(tmp_path: Path) -> tuple[Path, Path]:
    save = tmp_path / "ckpt"
    for segment, iteration in ((1, 10), (2, 20)):
        save_checkpoint(save, iteration)
        keep_segment_record(tmp_path, save, segment, iteration)
    return save, checkpoints.iteration_dir(save, 20)


def weights_of(folder: Path) -> Path:
    return folder / "mp_rank_00" / "model_optim_rng.pt"


# ---- item 5: a manifest that lists nothing (or not every file) verifies nothing


def test_an_empty_manifest_is_refused_naming_it_and_the_way_out(tmp_path):
    save, folder = two_checkpoints(tmp_path)
    manifest = folder / checksums.MANIFEST
    manifest.write_text(json.dumps({"algorithm": checksums.ALGORITHM, "files": {}}))
    flip(weights_of(folder))
    with pytest.raises(CheckpointError) as refused:
        check_checksums(str(save))
    message = str(refused.value)
    assert f"{manifest}: lists no files" in message, message
    assert "iteration 10, verifies" in message, message
    assert f"hpcllm accept-checkpoint {save}" in message, message


def test_a_file_the_manifest_does_not_list_is_refused(tmp_path, capsys):
    save, folder = two_checkpoints(tmp_path)
    manifest = folder / checksums.MANIFEST
    entries = json.loads(manifest.read_text())
    del entries["files"]["mp_rank_00/model_optim_rng.pt"]
    manifest.write_text(json.dumps(entries))
    flip(weights_of(folder))
    with pytest.raises(CheckpointError, match=f"{weights_of(folder)}: not in {manifest}"):
        check_checksums(str(save))
    # accept-checkpoint: the segment record still has the file's checksums
    assert cli.main(["accept-checkpoint", str(save), "--yes"]) == 1
    assert f"{weights_of(folder)}: damaged" in capsys.readouterr().err


def test_a_manifest_entry_without_its_digest_is_refused_not_a_raw_key_error(tmp_path):
    save, folder = two_checkpoints(tmp_path)
    manifest = folder / checksums.MANIFEST
    entries = json.loads(manifest.read_text())
    entries["files"]["common.pt"] = {"size": (folder / "common.pt").stat().st_size}
    manifest.write_text(json.dumps(entries))
    with pytest.raises(CheckpointError, match=f"{manifest}: unreadable.*common.pt"):
        check_checksums(str(save))


# ---- item 6: every manifest lost, the segment records show they were there


def test_all_manifests_deleted_are_refused_when_segment_records_show_checksums(tmp_path):
    save, folder = two_checkpoints(tmp_path)
    for iteration in (10, 20):
        (checkpoints.iteration_dir(save, iteration) / checksums.MANIFEST).unlink()
    flip(weights_of(folder))
    with pytest.raises(CheckpointError) as refused:
        check_checksums(str(save))
    message = str(refused.value)
    assert f"{folder}: committed without its checksums" in message, message
    assert str(records.kept_path(save, 2)) in message, message  # the evidence named
    assert "predates" not in message, message
    assert not (folder / checksums.MANIFEST).exists()  # never recorded over the damage


def test_checkpoints_older_than_the_first_record_with_checksums_still_predate(tmp_path, caplog):
    """Records of this version name the iterations they trained; a tracker pointed back
    at a checkpoint of an older hpcllm (before those records) is recorded as before."""
    save, _ = two_checkpoints(tmp_path)
    for iteration in (10, 20):
        (checkpoints.iteration_dir(save, iteration) / checksums.MANIFEST).unlink()
    records.kept_path(save, 1).unlink()  # iteration 10: trained by an older hpcllm
    checkpoints.write_tracker(save, 10)
    with caplog.at_level(logging.INFO):
        check_checksums(str(save))
    assert "iteration 10 predates checksums" in caplog.text


# ---- item 7: accept-checkpoint compares what it can, says what it could not, asks


def test_accept_refuses_a_flipped_file_the_segment_record_has_checksums_of(tmp_path, capsys):
    save, folder = two_checkpoints(tmp_path)
    (folder / checksums.MANIFEST).unlink()
    flip(weights_of(folder))
    assert cli.main(["accept-checkpoint", str(save), "--yes"]) == 1
    err = capsys.readouterr().err
    assert f"{weights_of(folder)}: damaged" in err, err
    assert str(records.kept_path(save, 2)) in err, err
    assert not (folder / checksums.MANIFEST).exists()
    with pytest.raises(CheckpointError):
        check_checksums(str(save))  # still refused


def test_accept_without_a_record_says_what_it_could_not_check_and_needs_yes(
    tmp_path, capsys, monkeypatch
):
    """A checkpoint of a job killed before it wrote its record: only the previous
    checkpoint's manifest can vouch for the files that do not change between saves."""
    save, folder = two_checkpoints(tmp_path)
    records.kept_path(save, 2).unlink()
    (folder / checksums.MANIFEST).unlink()
    monkeypatch.setattr("sys.stdin", _Stdin(tty=False))
    assert cli.main(["accept-checkpoint", str(save)]) == 1
    out, err = capsys.readouterr()
    assert "common.pt" in out and "metadata.json" in out, out  # same as iteration 10's
    assert "could not check" in out and "mp_rank_00/model_optim_rng.pt" in out, out
    assert "--yes" in err, err
    assert not (folder / checksums.MANIFEST).exists()

    monkeypatch.setattr("sys.stdin", _Stdin(tty=True, answer="n\n"))
    assert cli.main(["accept-checkpoint", str(save)]) == 1
    assert not (folder / checksums.MANIFEST).exists()

    monkeypatch.setattr("sys.stdin", _Stdin(tty=True, answer="y\n"))
    assert cli.main(["accept-checkpoint", str(save)]) == 0
    assert "recorded the checksums of iteration 20" in capsys.readouterr().out
    check_checksums(str(save))  # the user vouched for it


def test_accept_refuses_a_file_of_another_size_than_the_record_says(tmp_path, capsys):
    """A small file changed (other size): the segment record's checksums name it."""
    save, folder = two_checkpoints(tmp_path)
    (folder / checksums.MANIFEST).unlink()
    (folder / "metadata.json").write_text('{"sharded_backend": "torch", "x": 1}\n')
    assert cli.main(["accept-checkpoint", str(save), "--yes"]) == 1
    assert f"{folder / 'metadata.json'}:" in capsys.readouterr().err


# ---- item 8: a garbled manifest or tracker: a way out that keeps intact weights


def test_a_garbled_manifest_with_intact_weights_is_accepted_and_rewritten(tmp_path, capsys):
    save, folder = two_checkpoints(tmp_path)
    manifest = folder / checksums.MANIFEST
    manifest.write_text('{"algorithm": "xxh3_128", "files": {"mp_ran')
    with pytest.raises(CheckpointError) as refused:
        check_checksums(str(save))
    message = str(refused.value)
    assert f"{manifest}: unreadable" in message, message
    assert f"hpcllm accept-checkpoint {save}" in message, message  # keeps the weights
    assert cli.main(["accept-checkpoint", str(save), "--yes"]) == 0
    out = capsys.readouterr().out
    assert "every file" in out and str(records.kept_path(save, 2)) in out, out
    check_checksums(str(save))
    assert json.loads(manifest.read_text())["files"]


def test_accept_refuses_a_folder_whose_manifest_verifies(tmp_path, capsys):
    save, _ = two_checkpoints(tmp_path)
    assert cli.main(["accept-checkpoint", str(save), "--yes"]) == 1
    assert "its files verify against it; nothing to accept" in capsys.readouterr().err


def test_a_garbage_tracker_names_the_newest_checkpoint_with_checksums(tmp_path):
    save, _ = two_checkpoints(tmp_path)
    tracker = save / checkpoints.TRACKER
    tracker.write_text("\x00\x17garbage")
    with pytest.raises(CheckpointError) as refused:
        checkpoints.latest_iteration(save)
    message = str(refused.value)
    assert f"echo 20 > {tracker}" in message, message
    assert "delete" not in message, message


def test_a_tracker_naming_a_missing_folder_names_the_newest_checkpoint(tmp_path):
    save, _ = two_checkpoints(tmp_path)
    checkpoints.write_tracker(save, 30)
    with pytest.raises(CheckpointError, match=r"echo 20 > "):
        checkpoints.latest_iteration(save)


class _Stdin:
    """stdin as a terminal (answering ``answer``) or a pipe."""

    def __init__(self, tty: bool, answer: str = "") -> None:
        self.tty, self.answer = tty, answer

    def isatty(self) -> bool:
        return self.tty

    def readline(self) -> str:
        return self.answer
