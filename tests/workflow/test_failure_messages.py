"""What a user sees when a job fails or is interrupted: the reason line, the log and the fix."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from support import REPO, hang_guard, run_snakemake

from hpcllm.failures.summary import failed_jobs, failure_summary, reason_line, workflow_fix

SHARD = "data/tokenized/sample_bpe/sample_en/0001_text_document.bin"
MERGED = "data/tokenized/sample_bpe/sample_en_text_document.bin"
MERGE_LOG = "logs/merge_tokenized/sample_bpe/sample_en.log"


@pytest.mark.workflow
def test_a_corrupt_shard_prints_its_reason_log_and_forcerun_fix(workdir):
    # The tokenizer trains on sample_en only (its two shards), to keep the run small.
    (workdir / "en.yaml").write_text(
        "text:\n  tokenizers:\n    sample_bpe:\n      sources: [sample_en]\n"
    )
    # Targets first: after --configfile every word is read as a config file.
    common = ("--profile", "profiles/local", "--cores", "2", "--configfile", "en.yaml")
    first = run_snakemake(workdir, SHARD, *common)
    # Snakemake's per-job timing records are workflow outputs (under results/, which
    # `make clean` removes), apart from the benchmark scripts in benchmarks/.
    assert (workdir / "results/timings/tokenize/sample_bpe/sample_en/0001.tsv").is_file()
    assert (workdir / "results/timings/train_tokenizer/sample_bpe.tsv").is_file()
    assert not (workdir / "benchmarks").exists()
    # The tokenized shard is cut short after it was made; its time stamp is kept, so
    # Snakemake sees nothing to redo upstream and the merge job reads the damaged file.
    shard = workdir / SHARD
    stat = shard.stat()
    shard.write_bytes(shard.read_bytes()[:3000])
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    failed = run_snakemake(workdir, MERGED, *common, check=False)
    out = failed.stdout + failed.stderr
    assert failed.returncode != 0
    assert (
        f"merge_tokenized ({MERGE_LOG}): IndexedDatasetError: {SHARD}: holds 3000 bytes" in out
    ), out[-4000:]
    assert f"fix: rerun the same command with --forcerun {SHARD}" in out
    # The profiles do not ask for shell commands: every rule runs a script, so Snakemake
    # would print "Shell command: None" for each job.
    for proc in (first, failed):
        assert "Shell command" not in proc.stdout + proc.stderr

    # The fix it names works: the shard is made again and the merge job succeeds.
    run_snakemake(workdir, MERGED, "--forcerun", SHARD, *common)
    assert (workdir / MERGED).stat().st_size > 0


SLURM_BLOCK = """\
[Mon Nov 23 17:19:05 2026]
Error in rule train_segment:
    message: SLURM-job '42' failed, SLURM status is: 'FAILED'.
    jobid: 3
    output: results/train/x/seg1.json
    log: logs/train_segment/x/seg1.log, .snakemake/slurm_logs/rule_train_segment/42.log (check log file(s) for error details)
    external_jobid: 42
Error in rule fetch_text:
    message: None
    jobid: 1
Exiting because a job execution failed. Look above for error messages
"""


def test_failed_jobs_are_read_from_snakemakes_log_with_every_log_path():
    assert failed_jobs(SLURM_BLOCK) == [
        (
            "train_segment",
            [
                "logs/train_segment/x/seg1.log",
                ".snakemake/slurm_logs/rule_train_segment/42.log",
            ],
        ),
        ("fetch_text", []),
    ]


def test_the_reason_is_the_last_logged_error_else_the_last_exception_line(tmp_path):
    logged = tmp_path / "a.log"
    logged.write_text(
        "2026-11-23 17:19:05,101 INFO hpcllm.text: reading\n"
        "2026-11-23 17:19:05,123 ERROR hpcllm: SourceError: text.sources.web: no mirror\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "hpcllm.text.sources.SourceError: text.sources.web: no mirror\n"
    )
    assert reason_line(str(logged)) == "SourceError: text.sources.web: no mirror"
    plain = tmp_path / "b.log"
    plain.write_text("Traceback (most recent call last):\n  ...\nValueError: bad split\n")
    assert reason_line(str(plain)) == "ValueError: bad split"
    (tmp_path / "c.log").write_text("srun: error: node1: task 0: Killed\n")
    assert reason_line(str(tmp_path / "c.log")) is None
    assert reason_line(str(tmp_path / "missing.log")) is None


def test_a_reason_of_several_lines_is_read_to_its_traceback(tmp_path, monkeypatch):
    """A batch's error lists its failed shards, each with its own reason."""
    monkeypatch.chdir(tmp_path)
    log = "logs/tokenize_batch/t/s/0000.log"
    (tmp_path / "logs/tokenize_batch/t/s").mkdir(parents=True)
    (tmp_path / log).write_text(
        "2026-11-23 17:19:05,123 ERROR hpcllm: ShardPoolError: 1 of 12 shard(s) failed:\n"
        "  - shard 0003: exit code 1, log logs/shards/0003.log: BadRecord: a.jsonl:2: bad\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "hpcllm.text.shard_pool.ShardPoolError: 1 of 12 shard(s) failed:\n"
        "  - shard 0003: exit code 1, log logs/shards/0003.log: BadRecord: a.jsonl:2: bad\n"
    )
    assert reason_line(log) == (
        "ShardPoolError: 1 of 12 shard(s) failed:\n"
        "  - shard 0003: exit code 1, log logs/shards/0003.log: BadRecord: a.jsonl:2: bad"
    )
    (tmp_path / "run.log").write_text(
        f"Error in rule tokenize_batch:\n    message: None\n    log: {log} (check log file(s) "
        "for error details)\n"
    )
    assert failure_summary("run.log")[1:] == [
        f"  tokenize_batch ({log}): ShardPoolError: 1 of 12 shard(s) failed:",
        "    - shard 0003: exit code 1, log logs/shards/0003.log: BadRecord: a.jsonl:2: bad",
    ]


def test_a_fix_is_named_only_for_a_damaged_workflow_file():
    assert "--forcerun data/tokenized/t/s_text_document.bin" in workflow_fix(
        "IndexError: data/tokenized/t/s_text_document.bin: corrupt shard, size does not match"
    )
    assert workflow_fix("CorruptInput: /home/me/crawl.jsonl.zst: truncated zst data") is None
    assert workflow_fix("SourceError: data/raw/x is fine but the config is wrong") is None


def test_the_summary_says_when_a_log_has_no_error_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.log").write_text(SLURM_BLOCK)
    lines = failure_summary(str(tmp_path / "run.log"))
    assert lines[0].startswith("Why the jobs failed")
    assert "  train_segment: no error line in its log (logs/train_segment/x/seg1.log, " in lines[1]
    assert "  fetch_text: no error line in its log (no log: " in lines[2]


def test_ctrl_c_in_a_job_script_is_one_line_not_a_traceback(tmp_path):
    log = tmp_path / "job.log"
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(REPO / "src")!r})
        from hpcllm import logs
        logs.setup({str(log)!r})
        print("ready", flush=True)
        time.sleep(120)
        """
    )
    # As at a terminal: SIGINT at its default (a suite started in the background by a
    # non-interactive shell inherits it ignored, and Python then never raises on Ctrl-C).
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    # Hang guard (support.hang_guard), not a speed assertion: the exit is instant.
    _, err = proc.communicate(timeout=hang_guard(1))
    assert proc.returncode != 0
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip() == "interrupted (Ctrl-C); a rerun starts this job again"
    assert "ERROR hpcllm: interrupted (Ctrl-C)" in log.read_text()
