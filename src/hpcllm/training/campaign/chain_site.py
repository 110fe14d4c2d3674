"""Whether a campaign runs as a chain (hpcllm.training.campaign.chain), and how its jobs are
submitted.

The chain's jobs submit their successors from the compute nodes, which a site may refuse;
no site document we have states it for any cluster here. The answer comes from the site
probe (hpcllm.preflight.probe, the record's ``slurm_from_compute_node``: it submits,
requeues and cancels a held job from a compute node) or, where someone checked it by
hand, from the cluster fact ``slurm_from_compute_nodes``; the probe's answer wins.

- ``training.chain`` unset: a chain from the first run wherever the answer is known or
  this run's site probe finds it out (a Slurm cluster with GPUs: the probe runs before the
  first segment, and the chain's jobs are submitted as its answer says: each submitting
  its successor where compute nodes may call sbatch, else every job up front from the
  login node). Only where the answer is not known and no probe runs (a cluster without
  GPUs) does Snakemake submit one job per segment, and the plan says why.
- ``training.chain: true``: a chain whose jobs submit their successors where the site
  allows it or is not known, else one submitted up front from the login node: every job
  at once, each ``afterok`` the one before and ``singleton``, and each job that finds the
  campaign complete or stopped ends within seconds.
- ``training.chain: false``: one job per segment.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SiteAnswer:
    allowed: bool | None  # None: not known
    source: str  # where the answer comes from, for messages


def probe_record_path(cluster: Any, container: str | None) -> str:
    """The site probe's record of the image ``containers/<image>.sif`` (``bare`` without
    one); it exists only where the plan probes."""
    from hpcllm.preflight.probe import record_path

    image = Path(container).name.removesuffix(".sif") if container else "bare"
    return record_path(cluster.name, image)


def site_answer(cluster: Any, record_path: str | os.PathLike | None = None) -> SiteAnswer:
    """May this site's compute nodes call sbatch, scontrol requeue and scancel?"""
    if record_path:
        try:
            record = json.loads(Path(record_path).read_text())
        except (OSError, ValueError):
            record = {}
        allowed = record.get("slurm_from_compute_node")
        if isinstance(allowed, bool):
            return SiteAnswer(
                allowed,
                f"the site probe, job {record.get('job_id') or '-'} of {record.get('date') or '-'} "
                f"({record_path})",
            )
    fact = getattr(cluster, "slurm_from_compute_nodes", None)
    if isinstance(fact, bool):
        return SiteAnswer(fact, f"{getattr(cluster, 'path', '') or 'the cluster file'}: "
                          "slurm_from_compute_nodes")  # fmt: skip
    return SiteAnswer(None, "not known yet: the site probe answers it")


def chained(setting: bool | None, answer: SiteAnswer, probed: bool = False) -> bool:
    """Whether the campaign's segments run as a chain (``setting``: ``training.chain``;
    ``probed``: this run plans the site probe before the first segment, so the chain's
    jobs are submitted as its answer says, hpcllm.preflight.probe)."""
    if setting is not None:
        return setting
    return answer.allowed is not None or probed


def up_front(answer: SiteAnswer) -> bool:
    """Whether a chain is submitted up front from the login node (the site refuses)."""
    return answer.allowed is False


def plan_note(setting: bool | None, answer: SiteAnswer, probed: bool = False) -> str:
    """One line for the plan: how the segments are submitted, and why."""
    if setting is False:
        return "training: one Slurm job per segment (training.chain: false)"
    if not chained(setting, answer, probed):
        return (
            "training: one Slurm job per segment (training.chain unset): whether compute "
            "nodes may call sbatch is not known (the cluster file sets no "
            "slurm_from_compute_nodes, and without GPUs no site probe runs here to find "
            "out). Set slurm_from_compute_nodes in the cluster file where a site document "
            "says it (with its source), or training.chain: true for a chain"
        )
    default = "" if setting else " by default"
    if up_front(answer):
        return (
            f"training: each experiment's chain of Slurm jobs is submitted up front from the "
            f"login node{default} (compute nodes may not call sbatch: {answer.source})"
            + ("; training.chain: false submits one job per segment instead" if default else "")
        )
    if answer.allowed is None:
        return (
            f"training: each experiment runs as a chain of Slurm jobs{default}, in Slurm "
            "without the login node. Whether compute nodes may call sbatch is not known yet: "
            "the site probe, run before the first segment, finds out; where they may, each "
            "job submits its successor, else the chain is submitted up front from the "
            "login node"
        )
    return (
        f"training: each experiment runs as a chain of Slurm jobs{default}, each submitting its "
        f"successor (compute nodes may call sbatch: {answer.source})"
    )
