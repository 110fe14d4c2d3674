"""GPU energy counters, where the machine has them; None elsewhere (CPU, no library),
and their sum over the ranks of a job.

NVIDIA: NVML's total-energy counter (millijoules since the driver loaded), through
``pynvml`` (package nvidia-ml-py, in NGC containers). AMD: ``amdsmi``'s energy counter
(ROCm 6). Sites that measure with Jülich's ``jpwr`` wrap the whole command instead; its
CSV is outside this module. A missing library or an unsupported device just means no
energy columns in the summary.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def job_energy(local_joules: float | None) -> float | None:
    """Joules of every GPU of the job: each rank reads its own GPU, the sum is taken over
    all ranks (all nodes). None unless every rank had a counter: a partial sum would
    understate the job's energy."""
    import torch  # here: hpcllm status reads logs with log_energy, without torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return local_joules
    device = (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    )
    values = torch.tensor(
        [local_joules or 0.0, 0.0 if local_joules is None else 1.0],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(values)
    total, counted = values.tolist()
    return total if counted == dist.get_world_size() else None


class EnergyCounter:
    """Joules used by one GPU since the counter was created, or None if unknown."""

    def __init__(self, device_index: int) -> None:
        index = physical_index(device_index)
        self._read = _nvml_reader(index) or _amdsmi_reader(index)
        self._start = self._read() if self._read else None

    @property
    def available(self) -> bool:
        return self._start is not None

    def joules(self) -> float | None:
        if self._start is None:
            return None
        return self._read() - self._start


def physical_index(device_index: int, visible: str | None = None) -> int:
    """The GPU's index as NVML/amdsmi count (all GPUs of the node) from torch's index
    (among the visible ones): a site that gives each task one GPU sets
    CUDA_VISIBLE_DEVICES (ROCR/HIP on AMD) to it, and torch calls it 0."""
    if visible is None:
        for var in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
            visible = os.environ.get(var)
            if visible:
                break
    ids = [v.strip() for v in (visible or "").split(",") if v.strip()]
    if device_index < len(ids) and ids[device_index].isdigit():
        return int(ids[device_index])
    return device_index  # every GPU visible (or UUIDs, which this does not map)


def _nvml_reader(index: int):
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # raises where unsupported
    except Exception as e:  # no library, no driver, no GPU, an old GPU: no energy
        log.info("no NVML energy counter: %s", e)
        return None
    return lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0


def _amdsmi_reader(index: int):
    try:
        import amdsmi

        amdsmi.amdsmi_init()
        handle = amdsmi.amdsmi_get_processor_handles()[index]

        def read() -> float:
            e = amdsmi.amdsmi_get_energy_count(handle)
            return e["energy_accumulator"] * e["counter_resolution"] / 1e6  # uJ -> J

        read()
    except Exception as e:
        log.info("no amdsmi energy counter: %s", e)
        return None
    return read


ENERGY_FIELD = "energy per GPU (J/iter/GPU)"  # Megatron-LM's --log-energy, and the torch engine's


def log_energy(
    rows: list[dict], gpus: int, global_batch: int, seq_length: int, log_interval: int
) -> tuple[float, int] | None:
    """Joules and the tokens they trained, from a training log's iteration lines
    (``hpcllm.training.engines.log_lines.parse_log_lines``) that carry the energy field: each line's
    energy per GPU per iteration times its iterations (since the line before, at most
    ``log_interval``: a resumed attempt starts again) times the GPUs. None: no line had it
    (no counter on the GPUs, a CPU run, Megatron without --log-energy)."""
    joules, tokens, previous = 0.0, 0, None
    for row in rows:
        iteration = row["iteration"]
        steps = iteration - previous if previous is not None else log_interval
        if not 0 < steps <= log_interval:
            steps = min(log_interval, iteration)
        previous = iteration
        value = row.get(ENERGY_FIELD)
        if isinstance(value, float):
            joules += value * steps * gpus
            tokens += steps * global_batch * seq_length
    return (joules, tokens) if tokens else None


def wh_per_million_tokens(joules: float, tokens: int) -> float:
    return joules / 3600 / (tokens / 1e6)
