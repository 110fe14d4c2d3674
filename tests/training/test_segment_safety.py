"""A training segment's checkpoints and processes, on real tiny trainings: checksums
recorded at commit and verified before a resume (both engines' layouts), progress
counted from what an attempt trained, an attempt cut short during its start-up retried,
a segment's record kept through reruns, no engine outliving a segment stopped by Ctrl-C."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest
import torch
from support import hang_guard

from hpcllm.clusters import load_cluster
from hpcllm.training.campaign import attempts, records
from hpcllm.training.campaign.segment import SegmentIncomplete, run_segment
from hpcllm.training.checkpoints import checksums
from hpcllm.training.checkpoints import tracker as checkpoints
from hpcllm.training.checkpoints.checksums import check_checksums, record_checksums
from hpcllm.training.checkpoints.tracker import CheckpointError
from hpcllm.training.plan import settings as tracked
from hpcllm.training.plan.data import Blend
from hpcllm.training.plan.experiment import Paths, prepare_experiment

NAME = "safety"
PER_SEGMENT, SAVE_EVERY = 30, 15  # a kill after iteration 31 lands 13 iterations before a save


@pytest.fixture(scope="module")
def setup(text_workdir, repo):
    from snakemake.utils import validate

    training = {
        "experiments": {
            NAME: {
                "engine": "torch",
                "preset": "tiny",
                "data": {
                    "tokenizer": "sample_bpe",
                    "sources": {"sample_en": 1.0},
                    "split": "98,2,0",
                },
                "layout": {"nodes": 1, "procs_per_node": 1},
                "segments": 2,
                "iterations_per_segment": PER_SEGMENT,
                "save_interval": SAVE_EVERY,
            }
        }
    }
    validate(training, str(repo / "workflow/schemas/training.schema.yaml"))  # its defaults
    text = {"tokenizers": {"sample_bpe": {}}, "tokenize": {"tokenizers": ["sample_bpe"]},
            "sources": {"sample_en": {}}}  # fmt: skip
    cluster = load_cluster("local", repo / "config/clusters")
    prepared = prepare_experiment(NAME, training["experiments"][NAME], text, cluster)
    work = str(text_workdir)  # the data's paths, absolute: the tests run anywhere
    prepared = dataclasses.replace(
        prepared,
        blend=Blend(tuple(f"{work}/{p}" for p in prepared.blend.prefixes), prepared.blend.weights),
        tokenizer_files=tuple(f"{work}/{f}" for f in prepared.tokenizer_files),
    )
    return prepared, cluster, text_workdir / "data/index_cache" / NAME


def paths_in(folder: Path, segment: int, cache: Path) -> Paths:
    return Paths(
        save=str(folder / "ckpt"),
        record=str(folder / f"seg{segment}.json"),
        engine_log=str(folder / f"logs/seg{segment}.engine.log"),
        data_cache=str(cache),
        tensorboard=str(folder / "tb"),
    )


@pytest.fixture(scope="module")
def first_segment(setup, tmp_path_factory) -> Path:
    """Segment 1 trained by the wrapper: checkpoints 15 and 30, the tracker at 30."""
    prepared, cluster, cache = setup
    folder = tmp_path_factory.mktemp("first")
    run_segment(NAME, prepared, 1, paths_in(folder, 1, cache), cluster)
    return folder


def copy_of(first_segment: Path, tmp_path: Path) -> Path:
    shutil.copytree(first_segment / "ckpt", tmp_path / "ckpt")
    return tmp_path


def flip_inside_largest_tensor(path: Path, count: int = 64) -> None:
    """Flip ``count`` bytes in the middle of the largest tensor of a torch.save file."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
        assert info.compress_type == zipfile.ZIP_STORED
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = (
            int.from_bytes(f.read(2), "little"),
            int.from_bytes(f.read(2), "little"),
        )
        start = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
        f.seek(start)
        data = f.read(count)
        f.seek(start)
        f.write(bytes(b ^ 0xFF for b in data))


def test_a_damaged_checkpoint_is_refused_naming_the_file_and_the_previous_one(
    setup, first_segment, tmp_path
):
    """64 bytes flipped inside a tensor of the committed checkpoint (same size): torch
    loads it without complaint, but the next segment refuses it before its engine starts,
    naming the file and the previous committed checkpoint, which verifies."""
    prepared, cluster, cache = setup
    folder = copy_of(first_segment, tmp_path)
    save = folder / "ckpt"
    model = checkpoints.model_file(save, PER_SEGMENT)
    size = model.stat().st_size
    flip_inside_largest_tensor(model)
    assert model.stat().st_size == size
    torch.load(model, map_location="cpu", weights_only=False)  # silently "fine"
    paths = paths_in(folder, 2, cache)
    with pytest.raises(CheckpointError) as e:
        run_segment(NAME, prepared, 2, paths, cluster)
    message = str(e.value)
    assert f"{model}: damaged" in message, message
    assert f"iteration {SAVE_EVERY}, verifies" in message
    assert f"echo {SAVE_EVERY} > {save / checkpoints.TRACKER}" in message
    assert not Path(paths.engine_log).exists()  # no engine started
    (entry,) = attempts.load(attempts.attempts_path(paths.engine_log))
    assert entry.failure == "checkpoint_error"  # deterministic: not retried


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process: intended
def test_checksums_cover_a_megatron_torch_dist_folder(tmp_path):
    """A committed folder laid out as Megatron-LM's torch_dist checkpoint (written by
    torch.distributed.checkpoint, with Megatron's common.pt and metadata.json), recorded
    by the segment after the engine and verified before the next: a flipped shard byte
    is named, and the older checkpoint offered."""
    import torch.distributed.checkpoint as dcp

    save = tmp_path / "ckpt"
    for iteration in (10, 20):
        folder = checkpoints.iteration_dir(save, iteration)
        state = {"weight": torch.arange(4096, dtype=torch.float32) * iteration}
        dcp.save(state, storage_writer=dcp.FileSystemWriter(folder))
        torch.save({"iteration": iteration}, folder / "common.pt")
        (folder / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
        checkpoints.write_tracker(save, iteration)  # Megatron commits: the tracker
        record_checksums(str(save))
    manifest = json.loads((checkpoints.iteration_dir(save, 20) / checksums.MANIFEST).read_text())
    shards = [name for name in manifest["files"] if name.endswith(".distcp")]
    assert shards and {".metadata", "common.pt", "metadata.json"} <= set(manifest["files"])
    check_checksums(str(save))  # intact
    shard = checkpoints.iteration_dir(save, 20) / shards[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{shard}: damaged.*iteration 10, verifies"):
        check_checksums(str(save))


def dcp_checkpoints(save: Path, iterations) -> None:
    """Folders laid out as Megatron-LM's torch_dist checkpoints, each committed and its
    checksums recorded as the segment records them after the engine."""
    import torch.distributed.checkpoint as dcp

    for iteration in iterations:
        folder = checkpoints.iteration_dir(save, iteration)
        state = {"weight": torch.arange(4096, dtype=torch.float32) * iteration}
        dcp.save(state, storage_writer=dcp.FileSystemWriter(folder))
        torch.save({"iteration": iteration}, folder / "common.pt")
        checkpoints.write_tracker(save, iteration)
        record_checksums(str(save))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process: intended
def test_a_committed_checkpoint_without_its_checksums_is_refused_unless_accepted(tmp_path, capsys):
    """Issue 40: the manifest of the committed iteration deleted and a shard damaged.
    The next segment refuses it as unverified (other checkpoints have checksums), naming
    the older one that verifies and `hpcllm accept-checkpoint`; it records nothing. Once
    accepted, it resumes."""
    from hpcllm import cli

    save = tmp_path / "ckpt"
    dcp_checkpoints(save, (10, 20))
    folder = checkpoints.iteration_dir(save, 20)
    (folder / checksums.MANIFEST).unlink()
    shard = next(folder.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as refused:
        check_checksums(str(save))
    message = str(refused.value)
    assert f"{folder}: committed without its checksums" in message, message
    assert "iteration 10, verifies" in message and "rerun.." not in message, message
    assert f"`hpcllm accept-checkpoint {save}`" in message, message
    assert not (folder / checksums.MANIFEST).exists()  # never recorded over the damage

    # no segment record here: nothing recorded elsewhere vouches for the shards
    assert cli.main(["accept-checkpoint", str(save), "--yes"]) == 0
    assert "recorded the checksums of iteration 20" in capsys.readouterr().out
    check_checksums(str(save))  # the user vouched for it
    assert cli.main(["accept-checkpoint", str(save), "--yes"]) == 1
    assert "nothing to accept" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process: intended
def test_checkpoints_that_predate_checksums_are_recorded_and_said_unverified(tmp_path, caplog):
    save = tmp_path / "ckpt"
    dcp_checkpoints(save, (10,))
    (checkpoints.iteration_dir(save, 10) / checksums.MANIFEST).unlink()  # none has any
    with caplog.at_level(logging.INFO):
        check_checksums(str(save))
    assert "iteration 10 predates checksums" in caplog.text
    assert "verified against" not in caplog.text
    assert checksums.has_manifest(save, 10)


def engine_pids(save: Path) -> list[int]:
    """The torch engine processes writing ``save``."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if b"hpcllm.training.engines.torch_engine" in cmd and str(save).encode() in cmd:
            pids.append(int(entry.name))
    return pids


def test_an_attempt_killed_between_saves_counts_what_it_trained(setup, first_segment, tmp_path):
    """Segment 2's engine is killed (SIGKILL, no save) once it logged iteration 31, the
    checkpoint at 30: the attempt trained, so the next attempt may run."""
    prepared, cluster, cache = setup
    folder = copy_of(first_segment, tmp_path)
    save = folder / "ckpt"
    paths = paths_in(folder, 2, cache)
    log = Path(paths.engine_log)
    done = threading.Event()

    def kill_after_first_iteration() -> None:
        deadline = time.time() + hang_guard(30)  # the engine's start-up: ~30 s quiet
        while not done.is_set() and time.time() < deadline:
            if log.exists() and f"iteration {PER_SEGMENT + 1:8d}/" in log.read_text():
                for pid in engine_pids(save):
                    os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_after_first_iteration)
    killer.start()
    try:
        with pytest.raises(SegmentIncomplete):
            run_segment(NAME, prepared, 2, paths, cluster, attempt=1)
    finally:
        done.set()
        killer.join()
    assert checkpoints.latest_iteration(save) == PER_SEGMENT, log.read_text()[-2000:]
    (entry,) = attempts.load(attempts.attempts_path(log))
    assert entry.failure == "signal" and entry.logged_iteration > PER_SEGMENT, entry
    why = attempts.refusal(
        attempts.load(attempts.attempts_path(log)), 2, PER_SEGMENT, state_of=lambda job: None
    )
    assert why is None, why


def test_an_engine_killed_during_its_start_up_gets_its_next_attempt(setup, tmp_path, monkeypatch):
    """Issue 40: the engine SIGKILLed from outside during a segment's start-up, the job
    having an hour to run. It added no iteration, but it was cut short, not out of time:
    the next attempt runs (it was refused with "Give the segment a longer runtime")."""
    prepared, cluster, cache = setup
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time()) + 3600))
    paths = paths_in(tmp_path, 1, cache)
    save = Path(paths.save)
    done = threading.Event()

    def kill_the_engine_once_it_runs() -> None:
        deadline = time.time() + hang_guard(30)  # the data checks and the launch: ~5 s
        while not done.is_set() and time.time() < deadline:
            pids = engine_pids(save)
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            if pids:
                return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_the_engine_once_it_runs)
    killer.start()
    try:
        with pytest.raises(SegmentIncomplete, match="during the engine's start-up|before the"):
            run_segment(NAME, prepared, 1, paths, cluster, attempt=1)
    finally:
        done.set()
        killer.join()
    why = attempts.refusal(
        attempts.load(attempts.attempts_path(paths.engine_log)), 2, 0, state_of=lambda j: None
    )
    assert why is None, why
    (entry,) = attempts.load(attempts.attempts_path(paths.engine_log))
    assert (entry.failure, entry.reached_iteration, entry.logged_iteration) == ("signal", 0, None)
    assert entry.deadline - entry.ended > 3000, entry  # ended far before its time limit


def test_a_rerun_after_a_refused_settings_change_keeps_the_segments_record(
    setup, first_segment, tmp_path
):
    """Issue 40: a changed lr is refused (Snakemake had deleted seg1.json before the job);
    the rerun with the settings back finds segment 1 trained and restores the record of
    the job that trained it, not one of its own with seconds 0.0."""
    prepared, cluster, cache = setup
    folder = copy_of(first_segment, tmp_path)  # the checkpoints, not seg1.json
    shutil.copytree(first_segment / "logs", folder / "logs")
    trained = (first_segment / "seg1.json").read_text()
    paths = paths_in(folder, 1, cache)
    experiment = prepared.experiment
    other_lr = {**experiment, "optim": {**experiment["optim"], "lr": experiment["optim"]["lr"] / 2}}
    with pytest.raises(tracked.SettingsChanged):
        run_segment(NAME, dataclasses.replace(prepared, experiment=other_lr), 1, paths, cluster)
    assert not Path(paths.record).exists()
    record = run_segment(NAME, prepared, 1, paths, cluster)
    assert Path(paths.record).read_text() == trained
    assert (record["resumed_from_iteration"], record["first_iteration"]) == (0, 1)
    assert record["seconds"] > 0


def test_a_record_not_kept_is_written_as_trained_by_no_job(setup, first_segment, tmp_path):
    """Checkpoints from before records were kept: the rerun of a trained segment says
    plainly that it trained nothing, with no seconds or resume point of its own."""
    prepared, cluster, cache = setup
    folder = copy_of(first_segment, tmp_path)
    shutil.copytree(first_segment / "logs", folder / "logs")
    records.kept_path(folder / "ckpt", 1).unlink(missing_ok=True)
    paths = paths_in(folder, 1, cache)
    record = run_segment(NAME, prepared, 1, paths, cluster)
    assert json.loads(Path(paths.record).read_text()) == record
    assert record["trained_by_this_job"] is False and "trained nothing" in record["written_by"]
    assert "seconds" not in record and "resumed_from_iteration" not in record, record
    assert (record["first_iteration"], record["last_iteration"]) == (1, PER_SEGMENT)
    assert not records.kept_path(folder / "ckpt", 1).exists()  # no history made up


def test_a_segment_resumed_before_its_start_says_so_and_a_forced_rerun_keeps_it(
    setup, first_segment, tmp_path, caplog
):
    """Issue 40: the tracker pointed back to iteration 15, segment 2 (iterations 31..60)
    trains 16..60: its record says first_iteration 16, not 31 with resumed_from 15. A
    forced rerun of segment 2 afterwards (the checkpoint at 60) keeps that record. Each
    ends with a line in the job's log saying what it did (issue 40: none did)."""
    prepared, cluster, cache = setup
    folder = copy_of(first_segment, tmp_path)
    checkpoints.write_tracker(folder / "ckpt", SAVE_EVERY)
    paths = paths_in(folder, 2, cache)
    with caplog.at_level(logging.INFO, logger="hpcllm"):
        record = run_segment(NAME, prepared, 2, paths, cluster)
    assert (record["first_iteration"], record["resumed_from_iteration"]) == (
        SAVE_EVERY + 1,
        SAVE_EVERY,
    )
    assert record["last_iteration"] == 2 * PER_SEGMENT and record["seconds"] > 0
    done = [m for m in caplog.messages if m.startswith(f"segment 2 of {NAME} done")]
    assert done == [
        f"segment 2 of {NAME} done: iterations 16..60 in {record['seconds']:.0f} s, "
        f"lm loss {record['lm_loss']:.4g}, checkpoint {record['checkpoint']}"
    ], caplog.messages
    trained = Path(paths.record).read_text()
    Path(paths.record).unlink()  # what Snakemake does before a forced job
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hpcllm"):
        assert run_segment(NAME, prepared, 2, paths, cluster) == record
    assert Path(paths.record).read_text() == trained
    done = [m for m in caplog.messages if m.startswith(f"segment 2 of {NAME} done")]
    assert done == [
        f"segment 2 of {NAME} done: nothing to train, {paths.save} already holds iteration "
        f"60 (this segment's target: 60)"
    ], caplog.messages


def test_ctrl_c_to_the_segment_leaves_no_engine_behind(setup, tmp_path):
    """SIGINT to the segment's process just after it started the engine (a Ctrl-C that
    the engine, started a moment later, never saw): the segment ends as Ctrl-C ends a job,
    and no engine process remains to write checkpoints afterwards."""
    prepared, cluster, cache = setup
    paths = paths_in(tmp_path, 1, cache)
    args = tmp_path / "args.pickle"
    args.write_bytes(pickle.dumps((NAME, prepared, 1, paths, cluster)))
    code = (
        "import pickle, sys\n"
        "from hpcllm import logs\n"
        "from hpcllm.training.campaign.segment import run_segment\n"
        "logs.setup()\n"
        "run_segment(*pickle.loads(open(sys.argv[1], 'rb').read()))\n"
    )
    save = Path(paths.save)
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(args)],
        stderr=subprocess.PIPE,
        text=True,
        # SIGINT at its default, as at a terminal (a suite started in the background
        # inherits it ignored)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.time() + hang_guard(5)  # the data checks and the launch: ~5 s quiet
        while not engine_pids(save):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
            time.sleep(0.005)
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=hang_guard(10))[1]  # the engine's start-up: ~10 s
        left = engine_pids(save)
        written = sorted(p.name for p in save.iterdir()) if save.is_dir() else []
    finally:
        for pid in engine_pids(save):  # a failing run leaves none behind either
            os.kill(pid, signal.SIGKILL)
        proc.kill()
    assert proc.returncode != 0 and "interrupted (Ctrl-C)" in err, err[-3000:]
    assert left == [], err[-3000:]
    assert not [name for name in written if name.startswith(("iter_", "latest"))], written


def test_the_checksum_benchmark_prints_its_figures(repo, capsys):
    """benchmarks/checkpoint_checksum.py on a small checkpoint, so that it does not rot."""
    spec = importlib.util.spec_from_file_location(
        "bench", repo / "benchmarks/checkpoint_checksum.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--params-m", "2", "--rounds", "1", "--compare"]) == 0
    out = capsys.readouterr().out
    ratio = float(out.split("hashing / save: ")[1].split()[0])
    assert ratio > 0 and "MB/s" in out and "sha256" in out, out


def test_a_save_on_a_full_file_system_names_it_and_leaves_no_partial_checkpoint(
    setup, first_segment, tmp_path
):
    """Segment 2 resumes from segment 1's checkpoints on a real file system (tmpfs) with
    room for half a checkpoint more: its first save fails. The segment says disk_full,
    names the file system, its free space, what a checkpoint takes and the fix, and
    removes the partial folder, which would hold space and is never loaded."""
    from support import small_file_system

    prepared, cluster, cache = setup
    source = first_segment / "ckpt"
    held = sum(f.stat().st_size for f in source.rglob("*") if f.is_file())
    one = sum(
        f.stat().st_size
        for f in checkpoints.iteration_dir(source, checkpoints.latest_iteration(source)).rglob("*")
        if f.is_file()
    )
    kib = (held + one // 2) // 1024 + 64
    with small_file_system(tmp_path / "fs", f"{kib}k") as fs:
        shutil.copytree(source, fs / "ckpt")
        paths = dataclasses.replace(paths_in(tmp_path, 2, cache), save=str(fs / "ckpt"))
        with pytest.raises(SegmentIncomplete) as stopped:
            run_segment(NAME, prepared, 2, paths, cluster)
        left = sorted(p.name for p in (fs / "ckpt").iterdir())
        committed = checkpoints.latest_iteration(fs / "ckpt")
    message = str(stopped.value)
    print(message)
    assert committed == PER_SEGMENT, left  # what was committed stays
    assert stopped.value.failure == "disk_full", message
    assert "the checkpoint could not be written (removed its partial iter_" in message, message
    assert f"the file system at {fs} has " in message and "a checkpoint needs " in message
    assert f"Fix: free space on {fs}" in message
    assert not [name for name in left if name.endswith(".incomplete")], left


def test_a_segments_record_names_the_data_it_trained_on(setup, first_segment):
    from hpcllm.training.plan.data import data_digest

    prepared, _, _ = setup
    record = json.loads((first_segment / "seg1.json").read_text())
    assert record["data_digest"] == data_digest(prepared.blend.prefixes)


def test_a_segment_record_keeps_its_checksums_against_lost_manifests(
    setup, first_segment, tmp_path, capsys
):
    """Issue 51 items 6-7 through the real segment: every manifest deleted and a tensor
    flipped. The kept record of segment 1 shows the checkpoints had checksums, so the
    next segment refuses (no "predates" warning), and accept-checkpoint finds the flip
    against the record's own copy of the checksums."""
    from hpcllm import cli

    prepared, cluster, cache = setup
    folder = copy_of(first_segment, tmp_path)
    save = folder / "ckpt"
    kept = json.loads(records.kept_path(save, 1).read_text())
    model = checkpoints.model_file(save, PER_SEGMENT)
    assert kept["checkpoint_checksums"]["mp_rank_00/model_optim_rng.pt"]["size"] > 0
    for iteration in checkpoints.iteration_dirs(save):
        (checkpoints.iteration_dir(save, iteration) / checksums.MANIFEST).unlink()
    flip_inside_largest_tensor(model)
    paths = paths_in(folder, 2, cache)
    with pytest.raises(CheckpointError, match="committed without its checksums") as e:
        run_segment(NAME, prepared, 2, paths, cluster)
    assert str(records.kept_path(save, 1)) in str(e.value)
    assert not Path(paths.engine_log).exists()  # no engine started
    assert cli.main(["accept-checkpoint", str(save), "--yes"]) == 1
    assert f"{model}: damaged" in capsys.readouterr().err
    assert not checksums.has_manifest(save, PER_SEGMENT)
