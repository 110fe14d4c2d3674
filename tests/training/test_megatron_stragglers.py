"""Megatron-LM's straggler reports, written by Megatron's own ``StragglerDetector.report``
(megatron-core at the pin, as installed) and read back by
hpcllm.training.engines.megatron_stragglers into the segment record's ``stragglers``."""

from __future__ import annotations

import io
import logging

import pytest

from hpcllm.training.campaign import stragglers
from hpcllm.training.engines import megatron_stragglers

utils = pytest.importorskip("megatron.core.utils")


def megatron_report(ms_per_rank: dict[int, float], minmax_count: int, prefix: str = "") -> str:
    """The log lines rank 0 of Megatron-LM prints for ranks with these forward times per
    iteration (ms): its report() with the measured parts given (no GPU here: the CUDA
    events and the all-gather are what _min_max would collect), as its logger formats
    them (megatron/training/training.py's handler, which writes the message alone)."""
    out = io.StringIO()
    # as megatron/training/log_handler.py's CustomHandler, which training.py logs
    # through: a StreamHandler without a formatter, the message alone
    handler = logging.StreamHandler(out)
    utils.logger.addHandler(handler)
    level = utils.logger.level
    utils.logger.setLevel(logging.INFO)
    detector = object.__new__(utils.StragglerDetector)
    utils.StragglerDetector.__init__(detector)
    detector._off, detector.rank, detector.world = False, 0, len(ms_per_rank)
    detector.mmcnt = minmax_count
    detector.elapsed = lambda: (1000.0, 20.0, 60, 500, 99, 1980)

    def min_max(ptime, btime, temp, power, util, clock, flops):
        data = utils._StragglerData()
        fastest = min(ms_per_rank, key=ms_per_rank.get)
        slowest = max(ms_per_rank, key=ms_per_rank.get)
        data.min_elapsed = utils._ValueWithRank(ms_per_rank[fastest], fastest, "ms")
        data.max_elapsed = utils._ValueWithRank(ms_per_rank[slowest], slowest, "ms")
        # throughput: the same work over each rank's time (report's et_flops)
        data.aflops = sorted(
            (utils._ValueWithRank(300_000.0 / ms, rank) for rank, ms in ms_per_rank.items()),
            key=lambda v: v()[0],
        )
        return data

    detector._min_max = min_max
    detector._check_toggle = lambda: None
    try:
        assert detector.report(1e15, 10)
    finally:
        utils.logger.removeHandler(handler)
        utils.logger.setLevel(level)
    # ``prefix``: a label before each line (torchrun's --tee and srun --label add one)
    return "".join(f"{prefix}{line}\n" for line in out.getvalue().splitlines())


def test_the_slowest_of_eight_ranks_is_named_with_its_node_and_factor():
    """Eight ranks on two nodes of four, rank 6 at 1.5 x the others: every rank listed
    (--straggler-minmax-count 4), the median exact, rank 6 on the second node by name."""
    times = {rank: 1000.0 + rank for rank in range(8)}
    times[6] = 1500.0
    text = "iteration 10/ 100 | lm loss: 4.0\n" + megatron_report(times, 4, "[default0]:")
    found = megatron_stragglers.assess(text, 1.2, 8, ["n7", "n2"], 4)
    median = sorted(times.values())[3:5]
    assert found["slowest"]["rank"] == 6
    assert found["slowest"]["host"] == "n7"  # node names sorted: n2 holds ranks 0-3
    assert found["slowest"]["compute_seconds"] == 1.5
    assert found["slowest"]["factor"] == pytest.approx(1500 / (sum(median) / 2), rel=2e-3)
    assert found["beyond"] and found["ranks"] == 8
    assert "sorted by name" in found["host_from"]
    # the record's reader and status read it as the torch engine's
    assert "n7 (rank 6)" in stragglers.describe(found)


def test_within_the_factor_and_the_newest_report_wins():
    slow = {0: 1000.0, 1: 1010.0, 2: 1900.0, 3: 1005.0}
    even = {0: 1000.0, 1: 1010.0, 2: 1050.0, 3: 1005.0}
    found = megatron_stragglers.assess(
        megatron_report(slow, 2) + megatron_report(even, 2), 1.2, 4, ["a"], 4
    )
    assert found["slowest"]["rank"] == 2 and found["slowest"]["host"] == "a"
    assert not found["beyond"] and found["slowest"]["factor"] < 1.1


def test_two_ranks_from_the_min_and_max_fields():
    found = megatron_stragglers.assess(
        megatron_report({0: 1000.0, 1: 2000.0}, 1), 1.2, 2, ["x", "y"], 1
    )
    assert (found["slowest"]["rank"], found["slowest"]["host"]) == (1, "y")
    assert found["slowest"]["factor"] == pytest.approx(2000 / 1500, rel=1e-3)
    assert found["beyond"]


def test_no_report_no_verdict():
    assert megatron_stragglers.assess("iteration 1/ 10 | lm loss: 3.0\n", 1.2, 4, ["a"], 4) is None
    # a rank beyond the job's nodes gets no name (no node excluded on a guess)
    assert megatron_stragglers.rank_host(9, ["a", "b"], 4) is None


def test_only_this_attempts_reports_count(tmp_path):
    """The engine log holds every attempt's output: an earlier attempt's straggler (on
    nodes this job may not have) is not this attempt's."""
    log = tmp_path / "seg2.engine.log"
    log.write_text(megatron_report({0: 1000.0, 1: 3000.0}, 1))
    offset = log.stat().st_size
    with open(log, "a") as f:
        f.write(megatron_report({0: 1000.0, 1: 1010.0}, 1))
    whole = megatron_stragglers.assess_attempt(log, 0, 1.2, 2, ["a", "b"], 1)
    mine = megatron_stragglers.assess_attempt(log, offset, 1.2, 2, ["a", "b"], 1)
    assert whole["beyond"] is False  # the newest report of the file: the second attempt's
    assert mine["slowest"]["factor"] < 1.01 and not mine["beyond"]
    only_first = tmp_path / "seg3.engine.log"
    only_first.write_text(megatron_report({0: 1000.0, 1: 3000.0}, 1))
    size = only_first.stat().st_size
    assert megatron_stragglers.assess_attempt(only_first, 0, 1.2, 2, ["a", "b"], 1)["beyond"]
    assert megatron_stragglers.assess_attempt(only_first, size, 1.2, 2, ["a", "b"], 1) is None
    assert megatron_stragglers.assess_attempt(tmp_path / "none.log", 0, 1.2, 2, ["a"], 1) is None
