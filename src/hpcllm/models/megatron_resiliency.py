"""Megatron-LM's own resiliency features, as the site probe found them in the job's image,
and which of them the segments use.

At the pin (core_v0.19.0) Megatron-LM has two:

- **the straggler detector** (``--log-straggler``, ``StragglerDetectionConfig`` in
  megatron/training/config/resilience_config.py; the detector is
  ``megatron.core.utils.StragglerDetector``): every ``--log-interval`` iterations rank 0
  logs the fastest and slowest rank's time in the forward pass and their estimated
  throughput. It needs no nvidia-resiliency-ext, but at each report it reads every GPU's
  temperature, power, utilisation and clock through torch, which needs the GPU sensors'
  Python binding (pynvml, from nvidia-ml-py; amdsmi on ROCm): without one the first
  report raises and the job ends. The segments switch it on where the probe found both
  (experiment key ``resiliency: auto``), and read its lines
  (hpcllm.training.engines.megatron_stragglers).
- **in-process restart** (``--inprocess-restart``, megatron/training/inprocess_restart.py):
  wraps ``pretrain`` in nvidia-resiliency-ext's ``inprocess.Wrapper``; without
  nvidia_resiliency_ext.inprocess Megatron warns and runs unwrapped. Not enabled
  (:data:`INPROCESS_NOT_ENABLED` says why); the plan states whether the image has it.

The segment watchdog (hpcllm.training.campaign.watchdog) covers every engine either way.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The experiment key's values (workflow/schemas/training.schema.yaml): auto uses what the
# probe found in the image; off uses none of it.
SETTINGS = ("auto", "off")

# Megatron names the ranks with the lowest and highest throughput only for 1 < count <
# world (StragglerDetector.report); half the world each way lists every rank, so the
# median is exact up to this many ranks. Beyond, the lists stay two lines of about 1 kB.
MAX_LISTED = 64

INPROCESS_NOT_ENABLED = (
    "not enabled: it restarts training in the same processes on the same nodes (a stuck "
    "node stays in the job, where the watchdog's retry excludes it), its progress "
    "time-outs (90 s hard at the pin) are not sized from the measured save times, it "
    "takes two more TCP ports (MASTER_PORT+1, +2), and the segment's record would not "
    "see its restarts"
)


@dataclass(frozen=True)
class ImageResiliency:
    """What the probe's inside check (hpcllm.preflight.inside.resiliency) found."""

    nvrx_version: str | None = None  # nvidia-resiliency-ext's version; None: missing
    nvrx_inprocess: bool = False  # its in-process restart package
    gpu_sensors: str | None = None  # pynvml or amdsmi; None: neither
    megatron: dict[str, bool] | None = None  # option -> declared; None: no Megatron-LM

    @classmethod
    def from_inside(cls, inside: dict[str, Any] | None) -> ImageResiliency:
        found = (inside or {}).get("resiliency") or {}
        megatron = found.get("megatron")
        return cls(
            nvrx_version=found.get("nvidia_resiliency_ext"),
            nvrx_inprocess=bool(found.get("nvrx_inprocess")),
            gpu_sensors=found.get("gpu_sensors"),
            megatron=dict(megatron) if isinstance(megatron, dict) else None,
        )

    @property
    def straggler_log(self) -> bool:
        """Megatron's --log-straggler can run: declared, and the GPU sensors readable."""
        return bool((self.megatron or {}).get("log_straggler")) and self.gpu_sensors is not None

    @property
    def inprocess_restart(self) -> bool:
        """Megatron's --inprocess-restart would wrap training (not just warn)."""
        return bool((self.megatron or {}).get("inprocess_restart")) and self.nvrx_inprocess

    def straggler_text(self) -> str:
        if self.megatron is None:
            return "no Megatron-LM in the image"
        if not self.megatron.get("log_straggler"):
            return "the image's Megatron-LM has no --log-straggler"
        if self.gpu_sensors is None:
            return (
                "in Megatron-LM, but the image has no GPU sensor binding (pynvml from "
                "nvidia-ml-py, or amdsmi), which its reports read: not used"
            )
        return f"available (GPU sensors through {self.gpu_sensors})"

    def inprocess_text(self) -> str:
        if self.megatron is None or not self.megatron.get("inprocess_restart"):
            return "not in the image's Megatron-LM" if self.megatron else "no Megatron-LM"
        if not self.nvrx_inprocess:
            missing = (
                "nvidia-resiliency-ext missing"
                if self.nvrx_version is None
                else f"nvidia-resiliency-ext {self.nvrx_version} has no inprocess package"
            )
            return f"not in the image ({missing})"
        return f"available (nvidia-resiliency-ext {self.nvrx_version}), {INPROCESS_NOT_ENABLED}"

    def describe(self) -> str:
        nvrx = (
            f"nvidia-resiliency-ext {self.nvrx_version}"
            if self.nvrx_version
            else "no nvidia-resiliency-ext"
        )
        return (
            f"{nvrx}; Megatron's straggler detector (--log-straggler): "
            f"{self.straggler_text()}; Megatron's in-process restart (--inprocess-restart): "
            f"{self.inprocess_text()}"
        )


NO_RECORD = "no site probe record"


def from_record(path: str | Path) -> tuple[ImageResiliency | None, str]:
    """What the probe's record at ``path`` found, and where that comes from; None where
    there is no record (yet) or it is from a probe before this question."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None, f"{NO_RECORD} ({path})"
    inside = record.get("inside") if isinstance(record, dict) else None
    if not isinstance(inside, dict) or "resiliency" not in inside:
        return None, (
            f"the site probe's record {path} predates the question (the probe asks it when "
            "it runs again: a new image, changed site facts or modules)"
        )
    source = f"the site probe, job {record.get('job_id') or '-'} of {record.get('date') or '-'}"
    return ImageResiliency.from_inside(inside), source


def setting_of(experiment: dict[str, Any]) -> str:
    """The experiment's ``resiliency``: auto (the default) or off (YAML reads a bare
    ``off`` as false)."""
    value = experiment.get("resiliency", "auto")
    return "off" if value in ("off", False) else "auto"


def uses_straggler_log(engine: str, setting: str, found: ImageResiliency | None) -> bool:
    """Whether a segment runs Megatron's straggler detector: a megatron experiment with
    ``resiliency: auto`` whose image the probe found able to run it."""
    return engine == "megatron" and setting == "auto" and found is not None and found.straggler_log


def straggler_minmax_count(world: int) -> int:
    """``--straggler-minmax-count`` for ``world`` ranks: half of them each way (every
    rank listed) up to :data:`MAX_LISTED`; 1 for two ranks (the min/max fields name both)."""
    return 1 if world < 3 else min(math.ceil(world / 2), MAX_LISTED)


def plan_lines(
    experiments: dict[str, str], found: ImageResiliency | None, source: str, probed: bool
) -> list[str]:
    """The plan's lines on the engines' own features, for the megatron ``experiments``
    (name -> resiliency setting), from what the probe's record ``found`` (None: no record,
    or one before the question; ``source`` says which); ``probed``: this run's probe runs
    before the first segment. Nothing where no experiment runs Megatron-LM."""
    if not experiments:
        return []
    off = sorted(name for name, setting in experiments.items() if setting == "off")
    if found is not None:
        used = "used, " if found.straggler_log else ""
        straggler = f"{used}{found.straggler_text()} ({source})"
        inprocess = found.inprocess_text()
    elif probed and source.startswith(NO_RECORD):
        straggler = (
            "used where the site probe, run before the first segment, finds it able to run "
            "(Megatron-LM's option and the GPU sensors' Python binding in the image)"
        )
        inprocess = "the site probe, run before the first segment, finds out; " + (
            INPROCESS_NOT_ENABLED.replace("not enabled: ", "not enabled either way: ")
        )
    else:
        straggler = f"not used: {source}, so nothing says the image can run it"
        inprocess = f"not known ({source}); " + INPROCESS_NOT_ENABLED
    if off:
        straggler += f"; off for {', '.join(off)} (resiliency: off)"
    return [
        f"Megatron's straggler detector (--log-straggler): {straggler}",
        f"Megatron's in-process restart (--inprocess-restart): {inprocess}; "
        "the watchdog covers every engine",
    ]
