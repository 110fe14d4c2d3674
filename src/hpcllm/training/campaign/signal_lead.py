"""The fallback stop before a segment job's time limit: which signal, and how early.

Slurm's ``--signal=USR2@<lead>`` (no ``B:``) reaches every process of the job's steps
(proctrack): torchrun, which the launch starts with SIGUSR2 ignored
(:func:`hpcllm.launch.ignoring`), and its workers, which save and exit on it (Megatron-LM's
``--exit-signal-handler --exit-signal SIGUSR2``, the torch engine's handler). SIGTERM would
not do: torchrun handles it by killing its workers 30 s later (its shutdown timeout; an
older torch ignores TORCH_ELASTIC_SHUTDOWN_TIMEOUT), in the middle of a large model's save.

The lead must cover the iteration in progress and the save. The engines log how long
each save took (Megatron-LM's ``save-checkpoint`` timer line, which the torch engine
writes too); a segment's result record keeps the longest of its saves and the size of its
checkpoint (:func:`measure`). The lead of the next segment job is
``max(time.signal_seconds, SAVE_FACTOR x that save + an iteration)``, from the newest
record that has one (:func:`lead_seconds`); before anything was measured the configured
value stands, and the plan says so.
"""

from __future__ import annotations

import math
import signal
from pathlib import Path
from typing import Any

from hpcllm.training.campaign.calendar import iteration_times
from hpcllm.training.checkpoints.tracker import newest_kept_record
from hpcllm.training.engines.log_lines import parse_log_lines, save_seconds

# The signal the engines save and exit on before the time limit, as Slurm and Megatron-LM
# name it (--signal=USR2@..., --exit-signal SIGUSR2).
EXIT_SIGNAL = signal.SIGUSR2
SLURM_NAME = EXIT_SIGNAL.name.removeprefix("SIG")

# A save measured once may take longer the next time (a busier file system, a larger
# optimizer state after a layout change): the lead is twice the save, plus an iteration.
SAVE_FACTOR = 2


def folder_bytes(folder: str | Path) -> int:
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


def measure(engine_log_text: str, checkpoint: str | Path) -> dict[str, Any]:
    """A segment record's measurements: its longest save (s), the newest checkpoint's size
    (bytes) and the median logged iteration time (s); a key left out where not logged."""
    found: dict[str, Any] = {}
    saved = save_seconds(engine_log_text)
    if saved is not None:
        found["save_seconds"] = round(saved, 3)
    if Path(checkpoint).is_dir():
        found["checkpoint_bytes"] = folder_bytes(checkpoint)
    times = iteration_times(parse_log_lines(engine_log_text))  # the calendar's median
    if times:
        found["iteration_seconds"] = round(times["seconds_per_iteration"], 3)
    return found


def measured(save: str | Path) -> dict[str, Any] | None:
    """The newest segment record kept in the checkpoint folder (``chain/seg<k>.json``,
    hpcllm.training.campaign.records) that has a measured save; None before one."""
    return newest_kept_record(save, "save_seconds")


def lead_seconds(experiment: dict[str, Any], found: dict[str, Any] | None) -> int:
    """The --signal lead: time.signal_seconds, or more where a measured save (``found``,
    :func:`measured`) needs it."""
    configured = int(experiment["time"]["signal_seconds"])
    if not found:
        return configured
    needed = SAVE_FACTOR * found["save_seconds"] + (found.get("iteration_seconds") or 0)
    return max(configured, math.ceil(needed))


def lead_note(experiment: dict[str, Any], found: dict[str, Any] | None, name: str) -> str:
    """What the plan says about ``name``'s lead: its source, and a warning where the
    configured time.signal_seconds would not cover the measured save."""
    configured = int(experiment["time"]["signal_seconds"])
    if not found:
        return (
            f"{name}: Slurm's --signal={SLURM_NAME} comes time.signal_seconds = {configured} s "
            "before the time limit (no checkpoint save measured yet); keep it above a save"
        )
    lead = lead_seconds(experiment, found)
    size = found.get("checkpoint_bytes")
    measured_text = f"a save took {found['save_seconds']:.0f} s in segment {found['segment']}"
    if size:
        measured_text += f" ({size / 1e9:.2f} GB)" if size >= 1e8 else f" ({size / 1e6:.1f} MB)"
    if lead > configured:
        return (
            f"Warning: {name}: time.signal_seconds ({configured} s) is below what a save "
            f"needs ({measured_text}): Slurm's --signal={SLURM_NAME} comes {lead} s before "
            f"the time limit instead ({SAVE_FACTOR} x the save + an iteration); raise "
            "time.signal_seconds to keep it"
        )
    return (
        f"{name}: Slurm's --signal={SLURM_NAME} comes {lead} s before the time limit "
        f"(time.signal_seconds; {measured_text})"
    )


def slurm_signal(experiment: dict[str, Any], save: str | Path) -> str:
    """The segment job's ``--signal`` option for an experiment checkpointing to ``save``."""
    return f"--signal={SLURM_NAME}@{lead_seconds(experiment, measured(save))}"


def with_lead(sbatch: list[str], experiment: dict[str, Any], save: str | Path) -> list[str]:
    """``sbatch`` options with their ``--signal=...`` (if any) for the saves measured in
    ``save`` so far: a chain job submits its successor with them."""
    if not any(word.startswith("--signal=") for word in sbatch):
        return list(sbatch)
    option = slurm_signal(experiment, save)
    return [option if word.startswith("--signal=") else word for word in sbatch]
