"""What a user sees when a job fails for a known reason (a bad record, a full disk): the
message, not a traceback; the traceback stays in the job's log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import REPO, run_snakemake, small_file_system

from hpcllm.diskspace import DiskFull
from hpcllm.text.indexed_dataset import IndexedDatasetWriter, merge_datasets

CONFIG = """\
text:
  sources:
    bad:
      type: local
      files: in/bad.jsonl
      shards: 1
    full:
      type: local
      files: resources/sample_text/en.jsonl.zst
      shards: 1
  tokenizers:
    small:
      type: train
      vocab_size: 1000
      special_tokens: ["<|endoftext|>"]
      sample_documents: 500
      sources: [full]
  tokenize:
    tokenizers: [small]
"""
BAD = "data/tokenized/small/bad/0000_text_document.bin"
FULL = "data/tokenized/small/full/0000_text_document.bin"


@pytest.mark.workflow
def test_a_bad_record_and_a_full_disk_print_their_message_not_a_traceback(workdir):
    (workdir / "in").mkdir()
    (workdir / "in/bad.jsonl").write_text('{"text": "fine"}\n{"text": 5}\n')
    (workdir / "messages.yaml").write_text(CONFIG)
    # The full source's shard (about 0.3 MB of tokens) goes to a 64 KiB file system.
    with small_file_system(workdir / Path(FULL).parent, "64k") as fs:
        proc = run_snakemake(
            workdir,
            BAD,
            FULL,
            "--profile",
            "profiles/local",
            "--cores",
            "2",
            "--configfile",
            "messages.yaml",
            check=False,
            examples=False,  # this config alone over config/config.yaml
        )
        left = sorted(p.name for p in fs.iterdir())
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in out, out[-6000:]
    bad_log, full_log = "logs/tokenize/small/bad/0000.log", "logs/tokenize/small/full/0000.log"
    # Each job's message on the terminal, naming where its traceback is.
    assert (
        "BadRecord: ./in/bad.jsonl:2: field 'text' is not a string (source 'bad'; fix the "
        "input or set text.sources.bad.on_bad_record: skip to skip and count such records) "
        f"(traceback in {bad_log})"
    ) in proc.stderr, proc.stderr[-6000:]
    full = (
        f"DiskFull: no space left on device writing {FULL}: the file system at "
        f"{workdir / Path(FULL).parent} has 60.0 KiB free of 64.0 KiB; this step wrote "
    )
    assert full in proc.stderr, proc.stderr[-6000:]
    assert "so it needs more than that. Fix: free space on" in proc.stderr
    # The closing summary gives both reasons, each with its log.
    assert f"  tokenize ({bad_log}): BadRecord: ./in/bad.jsonl:2: " in proc.stderr
    assert f"  tokenize ({full_log}): DiskFull: no space left on device writing " in proc.stderr
    # The tracebacks are in the jobs' logs.
    for log, last in (
        (bad_log, "hpcllm.text.sources.BadRecord: "),
        (full_log, "OSError: [Errno 28]"),
    ):
        text = (workdir / log).read_text()
        assert "Traceback (most recent call last)" in text and last in text, text
    assert left == ["mount-point"], "the partial files were removed"


SCRIPT = """\
import sys
sys.path.insert(0, {src!r})
from hpcllm import logs
logs.setup({log!r})
with open({target!r}, "wb") as f:
    f.write(bytes(200_000))
"""


def test_a_full_disk_outside_the_packages_writers_is_named_too(tmp_path):
    """A job script's own write (no ``atomic`` around it) that fills the disk."""
    log = tmp_path / "job.log"
    with small_file_system(tmp_path / "fs", "64k") as fs:
        script = SCRIPT.format(src=str(REPO / "src"), log=str(log), target=str(fs / "out.bin"))
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode != 0
    assert proc.stderr.startswith(
        f"DiskFull: no space left on device writing {fs / 'out.bin'}: the file system at {fs} has "
    ), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert "OSError: [Errno 28] No space left on device" in log.read_text()


def test_a_merge_without_room_fails_before_writing_naming_what_it_needs(tmp_path):
    shards = []
    for k in range(2):
        prefix = tmp_path / f"{k}_text_document"
        with IndexedDatasetWriter(prefix, np.uint16) as w:
            w.add_documents(np.arange(50_000, dtype=np.uint16), [20_000, 30_000])
        shards.append(prefix)
    needed = sum(p.stat().st_size for p in tmp_path.iterdir())
    with small_file_system(tmp_path / "fs", "64k") as fs:
        with pytest.raises(DiskFull) as e:
            merge_datasets(shards, fs / "merged_text_document")
        left = sorted(p.name for p in fs.iterdir())
    assert str(e.value).startswith(
        f"no space left on device writing {fs / 'merged_text_document.bin'}: the file system "
        f"at {fs} has 60.0 KiB free of 64.0 KiB; this step needs {needed / 1024:.1f} KiB there"
    ), str(e.value)
    assert left == ["mount-point"]


RAISE = """\
import sys
sys.path.insert(0, {src!r})
from hpcllm import logs
from hpcllm.training.campaign.segment import SegmentRefused
logs.setup({log!r})
{statement}
"""


@pytest.mark.parametrize(
    "statement,terminal",
    [
        (
            "raise SegmentRefused('segment 2 of x, attempt 3 not run: attempt 2 failed for good')",
            "SegmentRefused: segment 2 of x, attempt 3 not run: attempt 2 failed for good "
            "(traceback in {log})\n",
        ),
        # Not one of the package's errors (a bug): its traceback stays on the terminal.
        ("{}['missing']", "Traceback (most recent call last):"),
    ],
)
def test_a_refused_segment_prints_its_message_and_a_bug_its_traceback(
    tmp_path, statement, terminal
):
    log = tmp_path / "job.log"
    script = RAISE.format(src=str(REPO / "src"), log=str(log), statement=statement)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 1
    if terminal.startswith("Traceback"):
        assert terminal in proc.stderr and "KeyError: 'missing'" in proc.stderr
    else:
        assert proc.stderr == terminal.format(log=log)
    assert "Traceback (most recent call last):" in log.read_text()


def test_a_full_quota_is_named_as_one(tmp_path):
    """EDQUOT (a project's or home quota on a cluster's file system, the usual way to run
    out of room there). This kernel's tmpfs has no quotas, so the error is raised by the
    script rather than by a real file system."""
    log, target = tmp_path / "job.log", tmp_path / "out.bin"
    statement = (
        f"import errno, os; raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), {str(target)!r})"
    )
    script = RAISE.format(src=str(REPO / "src"), log=str(log), statement=statement)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.startswith(
        f"DiskFull: disk quota exceeded writing {target}: the file system at "
    ), proc.stderr
    assert "Fix: raise the quota or free space in it (`quota`, or the site's tool" in proc.stderr
    assert "Traceback" not in proc.stderr and "Disk quota exceeded" in log.read_text()
