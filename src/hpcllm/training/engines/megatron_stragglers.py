"""Megatron-LM's straggler reports, read from the engine log (``--log-straggler``: the
segments switch it on where the image can run it, hpcllm.models.megatron_resiliency).

Every ``--log-interval`` iterations rank 0 logs (megatron/core/utils.py at the pin,
``StragglerDetector.report``; the values with two decimals, ``value/rank``)::

    [2024-03-14 23:07:56] | MnRtt/Rnk: 3453.08ms/8 | MxRtt/Rnk: 3468.20ms/0 | ...
    | MnEtpt/Rnk: 296.02TF/0 | MxEtpt/Rnk: 297.32TF/8
    ^^^^ Bottom 4 Ranks with lowest  Etpt(TF): 296.02/0, 296.10/5, ...
    ^^^^ Top    4 Ranks with highest Etpt(TF): ..., 297.32/8,

``Rtt`` is a rank's time per iteration in its timed forward pass, ``Etpt`` its estimated
throughput, the same work divided by that time: each rank's time is the slowest rank's
scaled by their throughputs, and the slowest is compared with the median of those. The lists name the ranks with the lowest and highest
throughput (``--straggler-minmax-count`` each way: every rank up to 128 ranks; beyond, the
median of the listed ranks stands for the median of all). The result has the shape of
hpcllm.training.campaign.stragglers.assess's, so the record, status and the next
segment's ``--exclude`` read it the same way.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcllm.training.engines.log_lines import log_text_from

_REPORT = re.compile(
    r"\| MnRtt/Rnk: (?P<min_ms>[\d.]+)ms/(?P<min_rank>\d+) \| "
    r"MxRtt/Rnk: (?P<max_ms>[\d.]+)ms/(?P<max_rank>\d+) \|.*"
    r"MnEtpt/Rnk: (?P<min_tf>[\d.]+)TF/(?P<min_tf_rank>\d+) \| "
    r"MxEtpt/Rnk: (?P<max_tf>[\d.]+)TF/(?P<max_tf_rank>\d+)"
)
_LIST = re.compile(r"\^\^\^\^ (?:Bottom|Top)\s+\d+ Ranks with (?:lowest|highest)\s+Etpt\(TF\):(.*)")
_ENTRY = re.compile(r"([\d.]+)/(\d+)")

SOURCE = "Megatron's straggler detector (--log-straggler): forward-pass time per iteration"
# Megatron names ranks, not nodes: the node is inferred (rank_host), and the record says so.
HOST_FROM = "rank // ranks per node, of the job's nodes sorted by name (torchrun's c10d order)"


@dataclass
class Report:
    """One report: the fastest and slowest rank's time (ms), and throughput per rank."""

    fastest: tuple[float, int]
    slowest: tuple[float, int]
    throughput: dict[int, float] = field(default_factory=dict)  # rank -> TFLOP/s


def reports(text: str) -> list[Report]:
    """Every straggler report in an engine log's ``text``, with the rank lists that
    follow it."""
    found: list[Report] = []
    for line in text.splitlines():
        if m := _REPORT.search(line):
            found.append(
                Report(
                    (float(m["min_ms"]), int(m["min_rank"])),
                    (float(m["max_ms"]), int(m["max_rank"])),
                    {
                        int(m["min_tf_rank"]): float(m["min_tf"]),
                        int(m["max_tf_rank"]): float(m["max_tf"]),
                    },
                )
            )
        elif (m := _LIST.search(line)) and found:
            for value, rank in _ENTRY.findall(m.group(1)):
                found[-1].throughput[int(rank)] = float(value)
    return found


def rank_host(rank: int, hosts: list[str], procs_per_node: int) -> str | None:
    """The node of global ``rank``: torchrun numbers ranks node by node, and its c10d
    rendezvous numbers the nodes in the order of their names (it sorts its participants,
    torch/distributed/elastic/rendezvous/dynamic_rendezvous.py), so ``hosts`` sorted.
    None where the rank is beyond them."""
    ordered = sorted(hosts)
    node = rank // max(procs_per_node, 1)
    return ordered[node] if 0 <= node < len(ordered) else None


def assess(
    text: str, factor: float, world: int, hosts: list[str], procs_per_node: int
) -> dict[str, Any] | None:
    """The newest report's slowest rank against the median of the ``world`` ranks, in
    stragglers.assess's shape (its node from ``hosts``, the job's nodes); None where no
    report compares enough ranks (none logged, or throughputs printed as 0.00 by a model
    too small for two decimals and more than two ranks)."""
    found = reports(text)
    if not found:
        return None
    last = found[-1]
    slow_ms, _ = last.slowest
    timed = {r: tf for r, tf in last.throughput.items() if tf > 0}
    if len(timed) >= 2:
        # each rank's time, from its throughput (the same work over its time), anchored
        # at the slowest rank's logged time: the median of times, as the torch engine's
        rank, slow_tf = min(timed.items(), key=lambda item: (item[1], -item[0]))
        ratio = slow_ms / statistics.median(slow_ms * slow_tf / tf for tf in timed.values())
        ranks = len(timed)
    elif world == 2 and last.fastest[0] > 0:  # both ranks are the min and the max
        rank = last.slowest[1]
        ratio = slow_ms / statistics.mean([slow_ms, last.fastest[0]])
        ranks = 2
    else:
        return None
    compute = slow_ms / 1000
    return {
        "median_compute_seconds": round(compute / ratio, 6),
        "slowest": {
            "rank": rank,
            "host": rank_host(rank, hosts, procs_per_node),
            "compute_seconds": compute,
            "factor": round(ratio, 3),
        },
        "threshold": factor,
        "beyond": ratio > factor,
        "ranks": ranks,
        "source": SOURCE,
        "host_from": HOST_FROM,
    }


def assess_attempt(
    engine_log: str | Path,
    offset: int,
    factor: float,
    world: int,
    hosts: list[str],
    procs_per_node: int,
) -> dict[str, Any] | None:
    """:func:`assess` on what this attempt wrote to ``engine_log`` (from byte ``offset``):
    an earlier attempt's reports, on other nodes, are not this one's."""
    text = log_text_from(engine_log, offset)
    return None if text is None else assess(text, factor, world, hosts, procs_per_node)
