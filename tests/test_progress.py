"""Progress lines: share, rate and ETA on a synthetic clock; in the log and on stderr."""

import logging
import subprocess
import sys

from hpcllm.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lines_at_the_interval_with_share_rate_and_eta():
    clock, lines = Clock(), []
    p = Progress("tokenize 0003", 5000, "documents", interval=30, clock=clock, emit=lines.append)
    clock.now += 10
    p.update(500)
    assert lines == []  # not yet 30 s
    clock.now += 20
    p.update(1500)  # 30 s in: 50 documents/s, 3500 left: 70 s
    clock.now += 5
    p.update(1700)  # 5 s after the last line: none
    clock.now += 65
    p.finish(5000)
    assert lines == [
        "tokenize 0003: 1,500 of 5,000 documents (30.0%), 50.0 documents/s, ETA 0:01:10",
        "tokenize 0003: 5,000 of 5,000 documents (100.0%), 50.0 documents/s, done in 0:01:40",
    ]


def test_an_unknown_total_gives_count_and_rate_only():
    clock, lines = Clock(), []
    p = Progress(
        "download fineweb 0000", None, "documents", interval=1, clock=clock, emit=lines.append
    )
    clock.now += 4
    p.update(40)  # the first work done: no rate yet
    clock.now += 4
    p.update(80)
    assert lines == [
        "download fineweb 0000: 40 documents",
        "download fineweb 0000: 80 documents, 10.0 documents/s",
    ]


def test_the_eta_is_measured_from_the_first_iteration_not_from_the_start_up():
    """A segment's start-up (95 s here) before iteration 1, then 1 iteration/s: the ETA
    is 4 s, not the 0:01:07 that counting the start-up gives."""
    clock, lines = Clock(), []
    p = Progress("segment 1 of tiny", 10, "iterations", interval=5, clock=clock, emit=lines.append)
    clock.now += 95
    p.update(1)
    clock.now += 5
    p.update(6)
    clock.now += 4
    p.finish(10)
    assert lines == [
        "segment 1 of tiny: 1 of 10 iterations (10.0%)",
        "segment 1 of tiny: 6 of 10 iterations (60.0%), 1 iterations/s, ETA 0:00:04",
        "segment 1 of tiny: 10 of 10 iterations (100.0%), 1 iterations/s, done in 0:01:44",
    ]


def test_progress_goes_to_the_log_file_and_to_stderr(tmp_path):
    """As a workflow script sets logging up (hpcllm.logs.setup): the rule's log has the
    line, and so has stderr (a local job's terminal, a Slurm job's output file)."""
    log = tmp_path / "job.log"
    code = (
        "from hpcllm import logs; from hpcllm.progress import Progress\n"
        f"logs.setup({str(log)!r})\n"
        "Progress('pack train', 10, 'images', interval=0).finish(10)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pack train: 10 of 10 images (100.0%)" in proc.stderr
    assert "pack train: 10 of 10 images (100.0%)" in log.read_text()
    logging.getLogger("hpcllm.progress").handlers[:] = []


def test_a_segment_reports_its_iterations_from_the_engine_log(tmp_path, monkeypatch):
    """While the engine runs, the segment reads the iterations it logged since its
    start (a half-written last line waits) and reports them of the segment's total."""
    import hpcllm.progress
    from hpcllm.training.campaign.segment import iteration_progress

    def line(i):
        return f" iteration {i:8d}/{90:8d} | consumed samples: {8 * i:12d} | lm loss: 5.0E+00 |\n"

    monkeypatch.setattr(hpcllm.progress, "INTERVAL_S", 0.0)
    lines = []
    monkeypatch.setattr(hpcllm.progress.log, "info", lines.append)
    engine_log = tmp_path / "seg2.engine.log"
    engine_log.write_text(line(30))  # segment 1's last line, from an earlier attempt
    update = iteration_progress("segment 2 of tiny", engine_log, start=30, stop=60)
    assert hpcllm.progress._rate(0.05) == "0.05" and hpcllm.progress._rate(2658.27) == "2,658"
    update()
    assert lines == []  # nothing new yet
    with open(engine_log, "a") as f:
        f.write(line(31) + line(45) + line(46)[:20])  # the last line still being written
    update()
    with open(engine_log, "a") as f:
        f.write(line(46)[20:])
    update()
    assert [entry.split(",")[0] for entry in lines] == [
        "segment 2 of tiny: 15 of 30 iterations (50.0%)",
        "segment 2 of tiny: 16 of 30 iterations (53.3%)",
    ]
