"""Pending reasons that Slurm does not resolve by itself, and what to change for each.

A job that exceeds a limit of its partition, QOS or association is queued but never
started where the site does not refuse it at submission (slurm.conf ``EnforcePartLimits=NO``,
the default, and QOS limits without ``DenyOnLimit``): squeue's reason then names the limit
(squeue(1), "JOB REASON CODES"; the ``QOSMax*``/``AssocMax*`` names are Slurm's
``job_state_reason`` strings, slurm/slurm.h). A wait on such a job would never end, so the
workflow's own waits (the chain's controller, hpcllm.training.campaign.chain) end it with
:func:`stuck_message`, naming the reason and the cluster fact or setting to change.

Reasons that end by themselves are not here: Resources, Priority, Dependency, BeginTime,
the held ones (a user's or an administrator's release), QOSJobLimit/QOSResourceLimit and
the Assoc*Limit ones that count running jobs or used resources (they clear as jobs end),
ReqNodeNotAvail and the partition's state (a maintenance ends), and QOSTimeLimit (the
QOS's accumulated time, GrpWall). PartitionNodeLimit also stands for nodes DOWN or DRAINED
(squeue(1)): it counts only where the job asks for more nodes than its partition allows
(:func:`confirmed`).
"""

from __future__ import annotations

import re
import subprocess

# reason -> (what it means, what to change). ``{facts}`` is the cluster file.
_NODES = (
    "the job asks for more nodes than {what} allows per job",
    "fewer nodes: the experiment's layout.nodes (or a benchmark's max_nodes); for a "
    "pre-flight job in the development QOS, devel_qos.nodes in {facts} (its limit, from "
    "`sacctmgr show qos <name> format=MaxTRESPerJob`), which then keeps larger jobs out of it",
)
_TIME = (
    "the job's time limit is longer than {what} allows",
    "gpu_partition.max_minutes in {facts} (the longest time limit of a GPU job; the "
    "segments' limits are sized within it), or devel_qos.max_minutes for a pre-flight job "
    "in the development QOS (`sacctmgr show qos <name> format=MaxWall`)",
)
_SIZE = (
    "the job asks for more per job (cores, GPUs or memory) than {what} allows",
    "the profile's resources of the rule (gres, cpus_per_task, mem_mb: "
    "profiles/<cluster>/config.yaml), within the limit `sacctmgr show qos` or "
    "`scontrol show partition` names",
)
STUCK_REASONS: dict[str, tuple[str, str, str]] = {
    # reason: (limit's owner, meaning, what to change)
    "PartitionNodeLimit": ("its partition", *_NODES),
    "PartitionTimeLimit": ("its partition", *_TIME),
    "QOSMaxNodePerJobLimit": ("its QOS", *_NODES),
    "QOSMaxWallDurationPerJobLimit": ("its QOS", *_TIME),
    "AssocMaxNodesPerJobLimit": ("its account (association)", *_NODES),
    "AssocMaxWallDurationPerJobLimit": ("its account (association)", *_TIME),
    "QOSMaxCpuPerJobLimit": ("its QOS", *_SIZE),
    "QOSMaxGRESPerJob": ("its QOS", *_SIZE),
    "QOSMaxMemoryPerJob": ("its QOS", *_SIZE),
    "AssocMaxCpuPerJobLimit": ("its account (association)", *_SIZE),
    "InvalidAccount": (
        "Slurm",
        "the account is not valid for this user or partition",
        "the profile's slurm_account ($HPCLLM_ACCOUNT where the profile reads it; "
        "`sacctmgr show assoc user=$USER` lists yours)",
    ),
    "InvalidQOS": (
        "Slurm",
        "the QOS is not valid for this account or partition",
        "the QOS: the profile's qos resource or --slurm-qos, or devel_qos.name in {facts} "
        "for a pre-flight job (`sacctmgr show assoc user=$USER format=account,qos`)",
    ),
    "BadConstraints": (
        "Slurm",
        "no node can satisfy the job's constraints",
        "the profile's constraint and resources of the rule (profiles/<cluster>/config.yaml)",
    ),
}


def is_stuck(state: str, reason: str | None) -> bool:
    """Whether a job in ``state`` waits for ``reason`` that Slurm will not resolve (for
    PartitionNodeLimit: may not; :func:`confirmed` decides)."""
    return state == "PENDING" and (reason or "") in STUCK_REASONS


def _fields(argv: list[str]) -> dict[str, str]:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", out))


def nodes_over_partition_limit(job_nodes: int, max_nodes: str, total_nodes: str) -> bool:
    """Whether a job of ``job_nodes`` exceeds its partition's MaxNodes or its node count
    (as ``scontrol show partition`` prints them: MaxNodes=UNLIMITED, TotalNodes=2)."""
    limits = [int(v) for v in (max_nodes, total_nodes) if v.isdigit()]
    return any(job_nodes > limit for limit in limits)


def confirmed(job: str, reason: str) -> bool:
    """Whether ``reason`` of pending job ``job`` is one Slurm does not resolve: always,
    but for PartitionNodeLimit, which counts only where the job asks for more nodes than
    its partition allows (not where some of its nodes are down)."""
    if reason != "PartitionNodeLimit":
        return reason in STUCK_REASONS
    found = _fields(["scontrol", "show", "job", "-o", job])
    nodes, partition = found.get("NumNodes", ""), found.get("Partition", "")
    if not partition or not nodes.split("-")[0].isdigit():
        return False
    limits = _fields(["scontrol", "show", "partition", "-o", partition])
    return nodes_over_partition_limit(
        int(nodes.split("-")[0]), limits.get("MaxNodes", ""), limits.get("TotalNodes", "")
    )


def stuck_message(job: str, reason: str, what: str, facts: str) -> str:
    """Why job ``job`` (``what``: e.g. "the chain of opengptx_800m's") will not start and
    what to change (``facts``: the cluster file's path)."""
    owner, meaning, change = STUCK_REASONS[reason]
    meaning = meaning.format(what=owner)
    return (
        f"{what} job {job} is PENDING for {reason}: {meaning}, which Slurm does not resolve "
        f"by itself (it would wait forever). Change {change.format(facts=facts)}; then run "
        "again"
    )
