"""Change tracking of an experiment (hpcllm.training.plan.settings), the warm-up refusal, and the
failure details of a killed engine and a corrupt checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcllm.bench.logparse import parse_megatron_log
from hpcllm.clusters import load_cluster
from hpcllm.failures.classify import killed_by_sigkill, oom_kill_count
from hpcllm.training.campaign.segment import checkpoint_problem, segment_failure
from hpcllm.training.checkpoints import lease
from hpcllm.training.engines.log_lines import parse_log_lines
from hpcllm.training.plan.experiment import prepare_experiment
from hpcllm.training.plan.reshard import layout_settings
from hpcllm.training.plan.settings import (
    SettingsChanged,
    check_checkpoint_settings,
    continuation_settings,
    data_settings,
    differences,
    layout_plan_refusal,
    param_text,
    plan_warning,
    record_saved_layout,
    restart_training,
    settings_path,
    weight_settings,
)

CLUSTERS = Path(__file__).resolve().parents[2] / "config/clusters"
TEXT = {
    "tokenizers": {"tok": {"vocab_size": 1000}},
    "tokenize": {"tokenizers": ["tok"]},
    "sources": {"a": {}, "b": {}},
}


def prepared(engine="torch", **overrides):
    exp = {
        "engine": engine,
        "preset": "tiny",
        "data": {"tokenizer": "tok", "sources": {"a": 1.0}, "split": "98,2,0"},
        "layout": {"nodes": 1, "procs_per_node": 1},
        "segments": 2,
        "iterations_per_segment": 4,
        "seed": 1234,
        "log_interval": 1,
        "threads": 1,
        "time": {"margin_seconds": 600, "signal_seconds": 300},
    }
    for key, value in overrides.items():
        section, _, sub = key.partition("__")
        if sub:
            exp.setdefault(section, {})[sub] = value
        else:
            exp[key] = value
    return prepare_experiment("exp", exp, TEXT, load_cluster("local", CLUSTERS))


# Weight-determining changes of each kind, and continuation-safe ones.
WEIGHT_CHANGES = {
    "optim.lr": {"optim__lr": 1e-3},
    "model.hidden_size": {"model__hidden_size": 128},
    "data.blend": {
        "data": {"tokenizer": "tok", "sources": {"a": 0.5, "b": 0.5}, "split": "98,2,0"}
    },
    "seed": {"seed": 7},
    "precision": {"precision": "bf16"},
    "batch.global": {"batch__global": 16},
    "optim.warmup_iters": {"optim__warmup_iters": 1},
}
CONTINUATION_CHANGES = {
    "segments": {"segments": 5},
    "iterations_per_segment": {"iterations_per_segment": 10},
    "save_interval": {"save_interval": 1},
    "keep_checkpoints.last": {"keep_checkpoints": {"last": 2, "every": 10}},
    "eval_interval": {"eval_interval": 2},
    "time.margin_seconds": {"time": {"margin_seconds": 60, "signal_seconds": 30}},
    "time.limit_minutes": {"time__limit_minutes": 90},
    # the torch engine's one full checkpoint resumes on any number of processes
    "layout.procs_per_node": {"layout": {"nodes": 1, "procs_per_node": 2}},
}


@pytest.mark.parametrize("key", WEIGHT_CHANGES)
def test_each_weight_determining_change_is_named(key):
    before, after = weight_settings(prepared()), weight_settings(prepared(**WEIGHT_CHANGES[key]))
    changed = differences(before, after)
    assert changed and all(c.split(":")[0] == key for c in changed), changed
    assert param_text(before) != param_text(after)


@pytest.mark.parametrize("key", CONTINUATION_CHANGES)
def test_continuation_safe_changes_leave_the_weight_settings_alone(key):
    base, changed = prepared(), prepared(**CONTINUATION_CHANGES[key])
    assert param_text(weight_settings(base)) == param_text(weight_settings(changed))
    assert param_text(data_settings(base)) == param_text(data_settings(changed))
    assert differences(continuation_settings(base), continuation_settings(changed))


def test_the_index_cache_follows_blend_split_sequence_tokenizer_and_seed():
    base = data_settings(prepared())
    for change in (
        WEIGHT_CHANGES["data.blend"],
        {"data": {"tokenizer": "tok", "sources": {"a": 1.0}, "split": "90,10,0"}},
        {"model__seq_length": 128},
        {"seed": 7},
    ):
        assert differences(base, data_settings(prepared(**change))), change
    assert not differences(base, data_settings(prepared(optim__lr=1e-3)))


def megatron(tmp_name="m", **layout):
    cluster = load_cluster("local", CLUSTERS)
    return prepare_experiment(
        tmp_name,
        {"engine": "megatron", "preset": "tiny", "data": {"tokenizer": "tok", "sources": {"a": 1}, "split": "98,2,0"},
         "layout": {"nodes": 1, "procs_per_node": 2, "tp": 1, **layout}, "segments": 1,
         "batch": {"global": 16},
         "iterations_per_segment": 4, "seed": 1},
        TEXT, cluster,
    )  # fmt: skip


def test_megatron_layout_is_recorded_beside_the_weights():
    """TP/PP/DP are the layout (compared by what Megatron reshards), not weights: a
    layout change that resumes plans no finished segment again."""
    one, two = megatron(), megatron(tp=2)
    assert param_text(weight_settings(one, "local")) == param_text(weight_settings(two, "local"))
    impl = "transformer_engine"
    assert layout_settings(one, impl) == {
        "layout.tp": 1, "layout.pp": 1, "layout.dp": 2, "layout.checkpoint_format": "none",
    }  # fmt: skip
    fully = megatron(tp=2, distributed_optimizer=True, reshardable_checkpoints=True)
    assert layout_settings(fully, impl)["layout.checkpoint_format"] == "fully_reshardable"
    dp_only = megatron(distributed_optimizer=True)
    assert layout_settings(dp_only, impl)["layout.checkpoint_format"] == "dp_reshardable"
    # Megatron's local layers resume without the distributed optimizer (megatron_args.as_run)
    assert layout_settings(dp_only, "local")["layout.checkpoint_format"] == "none"
    # the transformer implementation and the distributed optimizer stay weight-determining
    changed = differences(weight_settings(one, "local"), weight_settings(dp_only, impl))
    assert {c.split(":")[0] for c in changed} == {
        "layout.distributed_optimizer", "layout.transformer_impl",
    }  # fmt: skip


def test_a_tp_change_of_dp_reshardable_checkpoints_is_refused_at_plan_time(tmp_path):
    """Saved at TP=1 DP=2 in the distributed optimizer's default format: TP=2 is refused
    at plan time and at the segment's start, naming the format and both layouts; DP=1
    too (other buckets); a fully reshardable checkpoint resumes with either."""
    impl = "transformer_engine"
    save = tmp_path / "checkpoints" / "m"
    base = megatron(distributed_optimizer=True)
    weights = weight_settings(base, impl)
    check_checkpoint_settings(
        "m", save, weights, continuation_settings(base), False, layout_settings(base, impl)
    )
    (save / "iter_0000004").mkdir()
    (save / "latest_checkpointed_iteration.txt").write_text("4\n")
    wider = megatron(distributed_optimizer=True, tp=2)
    warning = plan_warning("m", save, weights, layout_settings(wider, impl))
    assert "'dp_reshardable'" in warning and "TP=1 PP=1 DP=2" in warning, warning
    assert "now asks for TP=2 PP=1 DP=1" in warning and "go back to tp: 1, pp: 1" in warning
    assert "reshardable_checkpoints: true" in warning and "restart-training m" in warning
    assert layout_plan_refusal("m", save, weights, layout_settings(wider, impl)) == warning
    with pytest.raises(SettingsChanged, match="'dp_reshardable'") as e:
        check_checkpoint_settings("m", save, weights, continuation_settings(wider), True,
                                  layout_settings(wider, impl))  # fmt: skip
    assert "nothing was started" in str(e.value)
    # the same layout, or another DP of the same buckets (2..40), resumes
    assert plan_warning("m", save, weights, layout_settings(base, impl)) is None
    more = megatron(distributed_optimizer=True, nodes=2)  # DP 4
    assert plan_warning("m", save, weights, layout_settings(more, impl)) is None
    single = megatron(distributed_optimizer=True, procs_per_node=1)  # DP 1: one bucket
    assert "go back to DP=2" not in plan_warning("m", save, weights,
                                                 layout_settings(single, impl))  # fmt: skip
    assert "buckets" in plan_warning("m", save, weights, layout_settings(single, impl))
    # asking for fully reshardable saves now does not make the saved checkpoint so: it
    # is recorded as the weaker format until a segment has saved in the new one
    asks = megatron(distributed_optimizer=True, reshardable_checkpoints=True)
    check_checkpoint_settings("m", save, weights, continuation_settings(asks), True,
                              layout_settings(asks, impl))  # fmt: skip
    assert json.loads(settings_path(save).read_text())["layout"]["layout.checkpoint_format"] == (
        "dp_reshardable"
    )
    assert plan_warning("m", save, weights, layout_settings(wider, impl)) is not None
    record_saved_layout(save, layout_settings(asks, impl))  # the segment saved
    fully_wider = megatron(distributed_optimizer=True, reshardable_checkpoints=True, tp=2)
    assert plan_warning("m", save, weights, layout_settings(fully_wider, impl)) is None
    assert plan_warning("m", save, weights, layout_settings(single, impl)) is None
    check_checkpoint_settings("m", save, weights, continuation_settings(fully_wider), True,
                              layout_settings(fully_wider, impl))  # fmt: skip
    assert json.loads(settings_path(save).read_text())["layout"]["layout.tp"] == 2


def test_without_the_distributed_optimizer_every_layout_resumes(tmp_path):
    impl = "transformer_engine"
    save = tmp_path / "m"
    base = megatron()
    weights = weight_settings(base, impl)
    check_checkpoint_settings(
        "m", save, weights, continuation_settings(base), False, layout_settings(base, impl)
    )
    (save / "iter_0000004").mkdir()
    (save / "latest_checkpointed_iteration.txt").write_text("4\n")
    for other in (megatron(tp=2), megatron(procs_per_node=1), megatron(nodes=2, tp=2)):
        assert plan_warning("m", save, weights, layout_settings(other, impl)) is None


def test_a_record_from_before_the_layout_section_reads_as_dp_reshardable(tmp_path):
    """Records written when TP/PP/DP were weights: read as the layout, in the format the
    distributed optimizer then saved in (Megatron's default)."""
    impl = "transformer_engine"
    base = megatron(distributed_optimizer=True)
    old = {**weight_settings(base, impl), "layout.tp": 1, "layout.pp": 1, "layout.dp": 2}
    settings_path(tmp_path).write_text(json.dumps({"weights": old, "continuation": {}}))
    (tmp_path / "iter_0000004").mkdir()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("4\n")
    weights = weight_settings(base, impl)
    assert plan_warning("m", tmp_path, weights, layout_settings(base, impl)) is None
    wider = megatron(distributed_optimizer=True, tp=2)
    assert "'dp_reshardable'" in plan_warning("m", tmp_path, weights,
                                              layout_settings(wider, impl))  # fmt: skip


def test_a_checkpoint_trained_with_other_settings_is_refused_naming_keys(tmp_path):
    save = tmp_path / "checkpoints" / "exp"
    base, changed = prepared(), prepared(optim__lr=1e-3, seed=7)
    check_checkpoint_settings(
        "exp", save, weight_settings(base), continuation_settings(base), False
    )
    recorded = json.loads(settings_path(save).read_text())
    assert recorded["weights"]["optim.lr"] == 3e-3
    with pytest.raises(SettingsChanged) as e:
        check_checkpoint_settings(
            "exp", save, weight_settings(changed), continuation_settings(changed), True
        )
    message = str(e.value)
    assert "optim.lr: 0.003 -> 0.001" in message and "seed: 1234 -> 7" in message
    assert "new name" in message and "hpcllm restart-training exp" in message
    assert json.loads(settings_path(save).read_text()) == recorded  # unchanged
    assert plan_warning("exp", save, weight_settings(changed)) is None  # nothing trained yet
    (save / "iter_0000004").mkdir()
    (save / "latest_checkpointed_iteration.txt").write_text("4\n")
    assert "will refuse" in plan_warning("exp", save, weight_settings(changed))
    assert plan_warning("exp", save, weight_settings(base)) is None
    # a continuation-safe change continues and is recorded
    longer = prepared(segments=5)
    check_checkpoint_settings(
        "exp", save, weight_settings(longer), continuation_settings(longer), True
    )
    assert json.loads(settings_path(save).read_text())["continuation"]["segments"] == 5


def test_a_folder_without_checkpoints_takes_the_new_settings(tmp_path):
    save = tmp_path / "exp"
    base, changed = prepared(), prepared(optim__lr=1e-3)
    check_checkpoint_settings(
        "exp", save, weight_settings(base), continuation_settings(base), False
    )
    check_checkpoint_settings(
        "exp", save, weight_settings(changed), continuation_settings(changed), False
    )
    assert json.loads(settings_path(save).read_text())["weights"]["optim.lr"] == 1e-3


def test_a_damaged_settings_record_is_refused_naming_it(tmp_path):
    save = tmp_path / "exp"
    save.mkdir()
    settings_path(save).write_text("{not json")
    base = prepared()
    with pytest.raises(SettingsChanged, match="training_settings.json: not a settings record"):
        check_checkpoint_settings(
            "exp", save, weight_settings(base), continuation_settings(base), True
        )


def test_restart_moves_the_checkpoints_aside_and_respects_a_live_writer(tmp_path):
    save = tmp_path / "exp"
    (save / "iter_0000002").mkdir(parents=True)
    (save / "latest_checkpointed_iteration.txt").write_text("2\n")
    # a live writer (another process, outside Slurm): refused, nothing moved
    writer = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from hpcllm.training.checkpoints import lease\n"
         "with lease.held(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)",
         str(save)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert writer.stdout.readline() == "held\n"
        with pytest.raises(lease.LeaseHeld, match=f"process {writer.pid}"):
            restart_training(save)
    finally:
        writer.kill()
        writer.wait()
    assert (save / "iter_0000002").is_dir()
    aside = restart_training(save)
    assert (aside / "iter_0000002").is_dir() and (
        aside / "latest_checkpointed_iteration.txt"
    ).exists()
    assert not (save / "iter_0000002").exists()
    assert restart_training(save) is None  # nothing left to move


# ------------------------------------------------------------ item 6: smaller defects


def test_a_run_shorter_than_its_warmup_is_refused_at_plan_time():
    with pytest.raises(ValueError) as e:
        prepared(segments=1, iterations_per_segment=2)  # tiny: warmup_iters 2
    message = str(e.value)
    assert "optim.warmup_iters = 2" in message and "= 2 iterations" in message
    assert "lr_warmup_steps < lr_decay_steps" in message
    prepared(segments=1, iterations_per_segment=3)  # one iteration past the warm-up runs


@pytest.mark.parametrize(
    ("text", "rc", "oom", "state", "expected"),
    [
        # the bare engine under bash, killed: bash reports it, exit status 128 + 9
        ("bash: line 3: 4242 Killed                  python -m x\n", 137, 0, None, "signal"),
        ("", 137, 0, None, "signal"),
        # torchrun's report of a worker killed by SIGKILL (a traceback follows)
        ("Traceback (most recent call last):\n  exitcode  : -9 (pid: 12)\n"
         "  error_file: <N/A>\n  traceback : Signal 9 (SIGKILL) received by PID 12", 1, 0, None,
         "signal"),
        # the kernel's OOM killer counted a kill in the job's cgroup meanwhile
        ("", 137, 1, None, "out_of_memory"),
        # Slurm's accounting names the step's end
        ("", 137, 0, "OUT_OF_MEMORY", "out_of_memory"),
        ("", 137, 0, "NODE_FAIL", "node_failure"),
        ("", 137, 0, "CANCELLED by 1000", "cancelled"),
        # not killed: unchanged
        ("Traceback (most recent call last):\n  boom", 1, 0, None, "error"),
    ],
)  # fmt: skip
def test_an_engine_killed_by_sigkill_is_classified_from_slurm_and_the_kernel(
    text, rc, oom, state, expected
):
    assert segment_failure(text, None, rc, oom, state) == expected


def test_killed_detection():
    assert killed_by_sigkill(137) and killed_by_sigkill(-9)
    assert not killed_by_sigkill(1, "Traceback ... ValueError: x")


@pytest.mark.parametrize("version", ["v1", "v2", "v2_slurm"])
def test_the_kernels_oom_record_is_read_from_the_jobs_cgroup(tmp_path, version):
    proc, root = tmp_path / "cgroup", tmp_path / "sys"
    if version == "v1":
        proc.write_text("4:memory:/slurm/uid_0/job_7/step_batch\n1:cpu:/\n")
        folder = root / "memory/slurm/uid_0/job_7"
        name, text = "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"
    elif version == "v2":
        proc.write_text("0::/user.slice/me\n")
        folder, name, text = root / "user.slice/me", "memory.events", "low 0\noom 1\noom_kill 2\n"
    else:  # the job's cgroup counts the kills of all its steps
        proc.write_text("0::/system.slice/slurmstepd.scope/job_9/step_batch/user/task_0\n")
        folder = root / "system.slice/slurmstepd.scope/job_9"
        name, text = "memory.events", "oom 1\noom_kill 1\n"
    folder.mkdir(parents=True)
    (folder / name).write_text(text)
    assert oom_kill_count(str(proc), str(root)) == {"v1": 3, "v2": 2, "v2_slurm": 1}[version]
    assert oom_kill_count(str(tmp_path / "missing"), str(root)) is None


def test_a_corrupt_checkpoint_is_named():
    text = (
        "Traceback (most recent call last):\n  File ...\n"
        "hpcllm.training.checkpoints.tracker.CheckpointError: checkpoints/x/iter_0000008/mp_rank_00/"
        "model_optim_rng.pt: cannot be loaded, the file is corrupt or incomplete (...)\n"
    )
    found = checkpoint_problem(text, "checkpoints/x")
    assert "iter_0000008/mp_rank_00/model_optim_rng.pt" in found
    assert checkpoint_problem("Traceback\nValueError: something else\n", "checkpoints/x") is None


LINE = (
    " [2026-11-21 10:20:12.422102] iteration       {it}/      30 | consumed samples:"
    "           80 | elapsed time per iteration (ms): 199.4 | learning rate: 2.491711E-03 |"
    " global batch size:     8 | lm loss: 7.701283E+00 | loss scale: 1.0 | grad norm: 1.143 |"
    " number of skipped iterations:   0 | number of nan iterations:   0 |"
)


def test_a_log_cut_mid_number_is_truncated_and_its_last_line_not_an_iteration(tmp_path):
    """A killed job's last line, cut inside the elapsed time: it still has an elapsed
    field (the wrong number), and must not count."""
    cut = LINE.format(it=3)[: LINE.format(it=3).index("199.4") + 2]  # "... (ms): 19"
    path = tmp_path / "engine.log"
    path.write_text(LINE.format(it=1) + "\n" + LINE.format(it=2) + "\n" + cut)
    log = parse_megatron_log(path)
    assert [i.iteration for i in log.iterations] == [1, 2]
    assert log.truncated
    # the segment's own parser (records, loss curve) skips it too, also once a later
    # attempt's output follows it on the next line
    assert [r["iteration"] for r in parse_log_lines(path.read_text())] == [1, 2]
    cut_loss = LINE.format(it=3)[: LINE.format(it=3).index("7.701283E+00") + 4]
    text = LINE.format(it=1) + "\n" + cut_loss + "\n==> launch\n"
    assert [r["iteration"] for r in parse_log_lines(text)] == [1]
    path.write_text(LINE.format(it=1) + "\n" + LINE.format(it=2) + "\n")
    assert not parse_megatron_log(path).truncated


def test_a_killed_attempts_cut_line_stays_on_its_own(tmp_path):
    from hpcllm.training.campaign.engine_process import run_launch

    log = tmp_path / "seg1.engine.log"
    log.write_text(LINE.format(it=1) + "\n" + LINE.format(it=2)[:60])  # killed mid-line
    assert run_launch("echo next", tmp_path / "s.sh", log, dict(os.environ)) == 0
    lines = log.read_text().splitlines()
    assert lines[1] == LINE.format(it=2)[:60] and lines[2].startswith("==> ")
    assert lines[3] == "next"


def test_workflow_docs_name_the_restart_command():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    assert "hpcllm restart-training" in docs and "training_settings.json" in docs
