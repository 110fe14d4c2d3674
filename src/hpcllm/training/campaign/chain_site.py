"""Whether a campaign runs as a chain (hpcllm.training.campaign.chain), and how its jobs are
submitted.

The chain's jobs submit their successors from the compute nodes, which a site may refuse;
no site document we have states it for any cluster here. The answer comes from the site
probe (hpcllm.preflight.probe, the record's ``slurm_from_compute_node``: it submits,
requeues and cancels a held job from a compute node) or, where someone checked it by
hand, from the cluster fact ``slurm_from_compute_nodes``; the probe's answer wins.

- ``training.chain`` unset: the chain is the default where the site allows it; where it
  refuses or is not known yet, Snakemake submits one job per segment.
- ``training.chain: true``: a chain whose jobs submit their successors where the site
  allows it or is not known, else one submitted up front from the login node: every job
  at once, each ``afterany`` the one before and ``singleton``, and each job that finds the
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


def chained(setting: bool | None, answer: SiteAnswer) -> bool:
    """Whether the campaign's segments run as a chain (``setting``: ``training.chain``)."""
    return setting if setting is not None else answer.allowed is True


def up_front(answer: SiteAnswer) -> bool:
    """Whether a chain is submitted up front from the login node (the site refuses)."""
    return answer.allowed is False


def plan_note(setting: bool | None, answer: SiteAnswer) -> str:
    """One line for the plan: how the segments are submitted, and why."""
    if setting is False:
        return "training: one Slurm job per segment (training.chain: false)"
    if not chained(setting, answer) and answer.allowed is False:
        return (
            "training: one Slurm job per segment (training.chain unset; compute nodes may "
            f"not call sbatch: {answer.source}; training.chain: true submits each "
            "experiment's chain up front from the login node instead)"
        )
    if not chained(setting, answer):
        # The rule's form (a plugin job or the chain's login-node wait) is fixed when the
        # controller reads the workflow, before this run's probe answers.
        return (
            "training: one Slurm job per segment in this run (training.chain unset). "
            "Whether compute nodes may call sbatch is not known yet: the site probe of "
            "this run finds out, and from the next run on each experiment runs as a chain "
            "of Slurm jobs where they may. training.chain: true chains it in this run"
        )
    if up_front(answer):
        return (
            "training: each experiment's chain of Slurm jobs is submitted up front from the "
            f"login node (compute nodes may not call sbatch: {answer.source})"
        )
    if answer.allowed is None:
        return (
            "training: each experiment runs as a chain of Slurm jobs, each submitting its "
            "successor, unless the site probe finds that compute nodes may not call sbatch: "
            "then the chain is submitted up front from the login node"
        )
    default = "" if setting else " by default"
    return (
        f"training: each experiment runs as a chain of Slurm jobs{default}, each submitting its "
        f"successor (compute nodes may call sbatch: {answer.source})"
    )
