"""A real hang: the torch engine on 2 local ranks (torchrun, gloo), launched by the
segment's own run path; segment 1 trains and records its iteration time, and in segment 2
one rank is frozen by SIGSTOP mid-segment. The watchdog ends the launch within its bound
(from segment 1's iteration time: the cluster's floor, small here), the attempt's record
says ``hang`` and names the frozen rank first, its host and what it was doing, the rank
that still ran as waiting, and the next attempt is allowed."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from support import hang_guard

from hpcllm.clusters import WatchdogFacts, load_cluster
from hpcllm.failures.classify import HANG_MARK
from hpcllm.training.campaign import attempts, watchdog
from hpcllm.training.campaign.engine_process import HANG_KILL_WAIT
from hpcllm.training.campaign.segment import SegmentIncomplete, run_segment
from hpcllm.training.checkpoints import lease
from hpcllm.training.engines.fault_injection import FAULT_ENV
from hpcllm.training.plan.data import Blend
from hpcllm.training.plan.experiment import Paths, prepare_experiment

NAME = "hang"
# The floor small for a test (a tiny model's iteration takes well under a second, so 4 of
# them are below it); the ceiling, a start-up's bound, large enough for the imports on a
# loaded 2-core machine.
FACTS = WatchdogFacts(floor_seconds=8, ceiling_seconds=90, heartbeat_seconds=1)
POLL = 5.0  # run_launch's default: how often the segment asks its watchdog


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
                },  # fmt: skip
                "layout": {"nodes": 1, "procs_per_node": 2},
                "segments": 2,
                "iterations_per_segment": 12,  # segment 2: rank 1 freezes before its end
                "log_interval": 2,
            }
        }
    }
    validate(training, str(repo / "workflow/schemas/training.schema.yaml"))  # its defaults
    text = {"tokenizers": {"sample_bpe": {}}, "tokenize": {"tokenizers": ["sample_bpe"]},
            "sources": {"sample_en": {}}}  # fmt: skip
    cluster = load_cluster("local", repo / "config/clusters")
    cluster = dataclasses.replace(cluster, watchdog=FACTS)
    prepared = prepare_experiment(NAME, training["experiments"][NAME], text, cluster)
    work = str(text_workdir)
    prepared = dataclasses.replace(
        prepared,
        blend=Blend(tuple(f"{work}/{p}" for p in prepared.blend.prefixes), prepared.blend.weights),
        tokenizer_files=tuple(f"{work}/{f}" for f in prepared.tokenizer_files),
    )
    return prepared, cluster, text_workdir / "data/index_cache" / NAME


def paths_of(tmp_path, cache, segment: int) -> Paths:
    """Segment ``segment``'s paths in ``tmp_path`` (one checkpoint folder for all)."""
    return Paths(
        save=str(tmp_path / "ckpt"),
        record=str(tmp_path / f"seg{segment}.json"),
        engine_log=str(tmp_path / f"logs/seg{segment}.engine.log"),
        data_cache=str(cache),
        tensorboard=str(tmp_path / "tb"),
    )


def freeze_rank_when_training(
    folder: Path, rank: int, after: int, frozen: dict, stop: threading.Event
):
    """SIGSTOP ``rank`` once its heartbeat shows it training past iteration ``after``."""
    deadline = time.time() + hang_guard(120)
    while not stop.is_set() and time.time() < deadline:
        try:
            beat = json.loads((folder / f"rank{rank}.json").read_text())
        except (OSError, ValueError):
            beat = {}
        if beat.get("phase") in ("data", "step", "sync") and beat.get("iteration", 0) > after:
            os.kill(beat["pid"], signal.SIGSTOP)
            frozen.update(beat, at=time.monotonic())
            return
        time.sleep(0.05)


def test_a_frozen_rank_ends_the_segment_as_a_hang_naming_it(setup, tmp_path):
    prepared, cluster, cache = setup

    first = run_segment(NAME, prepared, 1, paths_of(tmp_path, cache, 1), cluster)
    assert 4 * first["iteration_seconds"] < FACTS.floor_seconds, first  # the floor bounds
    paths = paths_of(tmp_path, cache, 2)
    frozen: dict = {}
    stop = threading.Event()
    hearts = watchdog.heartbeat_dir(paths.engine_log)
    freezer = threading.Thread(
        target=freeze_rank_when_training, args=(hearts, 1, 14, frozen, stop), daemon=True
    )
    freezer.start()
    try:
        with pytest.raises(SegmentIncomplete) as e:
            run_segment(NAME, prepared, 2, paths, cluster)  # the signals: the main thread's
        ended = time.monotonic()
    finally:
        stop.set()
        freezer.join()
        if frozen.get("pid"):  # never leave a stopped process behind
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(frozen["pid"], sig)
                except ProcessLookupError:
                    pass
    log = Path(paths.engine_log).read_text()
    print(f"from the freeze to the segment's end: {ended - frozen.get('at', ended):.1f} s")
    assert frozen, f"rank 1 never trained:\n{log[-3000:]}"
    assert e.value.failure == "hang", f"{e.value}\n{log[-3000:]}"
    # within the bound: no progress for the bound, seen at the next poll, then the kill
    assert ended - frozen["at"] < FACTS.floor_seconds + 2 * POLL + HANG_KILL_WAIT + 15
    entry = attempts.load(attempts.attempts_path(paths.engine_log))[-1]
    assert entry.failure == "hang" and entry.hang is not None
    assert entry.hang["bound_seconds"] == FACTS.floor_seconds  # 4 iterations are less
    stopped = entry.hang["stopped"][0]
    assert (stopped["rank"], stopped["pid"]) == (1, frozen["pid"])
    assert stopped["phase"] in ("data", "step", "sync") and stopped["iteration"] > 14
    assert [r["rank"] for r in entry.hang["waiting"]] == [0]  # alive, blocked on rank 1
    assert f"rank 1 on {frozen['host']} (pid {frozen['pid']}" in entry.message
    assert "stopped reporting first" in entry.message
    assert HANG_MARK in log
    # a hang is retried: the next attempt may run (no progress needed, cut short)
    assert attempts.refusal(attempts.load(attempts.attempts_path(paths.engine_log)), 2, 12,
                            engine_log=paths.engine_log, save=paths.save) is None  # fmt: skip
    assert lease.read(paths.save) is None  # released
    # gone (or a zombie) once the kernel ran its exit: on a loaded machine that can take
    # a moment after the SIGKILL above
    deadline = time.monotonic() + hang_guard(10)
    while Path(f"/proc/{frozen['pid']}").exists() and not _zombie(frozen["pid"]):
        assert time.monotonic() < deadline, f"rank 1 (pid {frozen['pid']}) still runs"
        time.sleep(0.1)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize(
    ("fault", "rank", "phase", "iteration"),
    [("save:0:12", 0, "save", 24), ("data:1:14", 1, "data", 15)],
    ids=["stuck-save", "stuck-data-loader"],
)
def test_a_rank_stuck_alive_ends_the_segment_as_a_hang_naming_it(
    setup, tmp_path, monkeypatch, fault, rank, phase, iteration
):
    """A rank blocks forever in its save (rank 0, the writer, before its write: segment
    2's checkpoint never completes) or in its data loading (rank 1, iteration 15),
    through the engine's test-only fault hook: its heartbeat thread runs on (alive), its
    progress stops. The watchdog ends the launch within the phase's bound (from segment
    1's measured save and iteration: the floor) and names that rank first, in that phase,
    though the other is as alive, waiting for it (in the save's barrier, in the step's
    gradient all-reduce)."""
    prepared, cluster, cache = setup

    first = run_segment(NAME, prepared, 1, paths_of(tmp_path, cache, 1), cluster)
    assert first.get("save_seconds") is not None, first  # the save's bound is measured
    paths = paths_of(tmp_path, cache, 2)
    monkeypatch.setenv(FAULT_ENV, fault)
    started = time.monotonic()
    with pytest.raises(SegmentIncomplete) as e:
        run_segment(NAME, prepared, 2, paths, cluster)
    took = time.monotonic() - started
    log = Path(paths.engine_log).read_text()
    print(f"segment 2 with a rank stuck in its {phase}: ended after {took:.1f} s")
    assert e.value.failure == "hang", f"{e.value}\n{log[-3000:]}"
    entry = attempts.load(attempts.attempts_path(paths.engine_log))[-1]
    assert entry.failure == "hang" and entry.hang is not None
    assert entry.hang["bound_seconds"] == FACTS.floor_seconds
    assert entry.hang["stopped"] == []  # both alive: their heartbeat threads wrote on
    stuck, other = entry.hang["waiting"]
    assert (stuck["rank"], stuck["phase"], stuck["iteration"]) == (rank, phase, iteration)
    assert other["rank"] == 1 - rank
    assert f"every rank alive; rank {rank} on {stuck['host']} (pid {stuck['pid']}, in '{phase}'" \
        in entry.message, entry.message  # fmt: skip
    assert HANG_MARK in log
    # hang guard: the start-up (within the ceiling), the training, then the bound
    assert took < FACTS.ceiling_seconds + 60 + FACTS.floor_seconds + 2 * POLL + HANG_KILL_WAIT
    assert lease.read(paths.save) is None  # released


def test_a_slowed_rank_is_named_as_the_straggler(setup, tmp_path, monkeypatch):
    """Rank 1 sleeps 0.3 s in every step's compute (the engine's test-only hook): the
    segment's record names it as the slowest, with a factor above the cluster's, the
    status line says so and the next segment's job would exclude its node."""
    from hpcllm.training.campaign import stragglers
    from hpcllm.training.campaign.status import newest_straggler

    prepared, cluster, cache = setup
    monkeypatch.setenv(FAULT_ENV, "slow:1:0:0.3")
    record_dir = tmp_path / "results"
    paths = Paths(
        save=str(tmp_path / "ckpt"),
        record=str(record_dir / "seg1.json"),
        engine_log=str(tmp_path / "logs/seg1.engine.log"),
        data_cache=str(cache),
        tensorboard=str(tmp_path / "tb"),
    )
    # an earlier run's attempt at segment 1 hung with its stuck rank on this host: with
    # the straggler, this host is suspect twice (hpcllm.training.campaign.suspects)
    host = socket.gethostname()
    stuck = {"rank": 0, "host": host, "pid": 1, "phase": "data", "iteration": 3}
    earlier = attempts.attempts_path(paths.engine_log)
    earlier.parent.mkdir(parents=True)
    earlier.write_text(json.dumps([{
        "attempt": 1, "job_id": "41", "host": host, "start_iteration": 0, "started": 1.0,
        "reached_iteration": 0, "failure": "hang", "ended": 2.0,
        "hang": {"stopped": [], "waiting": [stuck], "phase": "data", "bound_seconds": 8}}]))  # fmt: skip
    record = run_segment(NAME, prepared, 1, paths, cluster)
    found = record["stragglers"]
    assert record["report_to_admins"] == [
        f"node {host} was excluded twice (hang in segment 1, straggler in segment 1): "
        "report it to the site's admins"
    ], record
    print(f"straggler: {stragglers.describe(found)}")
    assert found["ranks"] == 2 and found["slowest"]["rank"] == 1, found
    assert found["slowest"]["compute_seconds"] >= 0.3  # the sleep is compute
    assert found["slowest"]["factor"] > cluster.watchdog.straggler_factor and found["beyond"]
    host = found["slowest"]["host"]
    assert json.loads(Path(paths.record).read_text())["stragglers"] == found  # kept
    assert stragglers.nodes_to_exclude(paths.record) == [host]
    line = newest_straggler(record_dir)
    assert line.startswith(f"segment 1: slowest node: {host} (rank 1)") and "beyond" in line
