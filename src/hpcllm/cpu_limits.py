"""Time limits of CPU-only jobs, sized from their work where they hold GPU nodes.

On a site without a CPU partition for the project every Slurm job gets whole GPU nodes,
so a fixed, generous limit for a job that needs one core (the index cache, an export)
bills a GPU node for hours it does not use. There the limit is sized from the job's work
at a rate measured here, times a margin for a shared parallel file system, plus the
start of the image. Where CPU jobs run on CPU nodes, the fixed limit stays unless the
work needs more: a tight limit would only risk the job there.
"""

from __future__ import annotations

import math

# The image's start, the imports and a parallel file system's first reads.
START_MINUTES = 10
# The rates below were measured from the page cache of a 2-core machine; a job reads a
# parallel file system shared with the whole site.
MARGIN = 10
# benchmarks/index_cache.py --gb 2 (docs/measurements/training.md): Megatron Core built
# the cache for 965,848 train samples in 8.6 s on 2 loaded cores.
INDEX_SAMPLES_PER_S = 965_848 / 8.6
# benchmarks/checkpoint_checksum.py (docs/training.md): torch.save wrote 170-240 MB/s,
# the slowest of the export's reads and writes here.
EXPORT_BYTES_PER_S = 170e6


def index_cache_minutes(train_samples: int) -> int:
    """prepare_data_cache: Megatron's document, sample and shuffle indices and the blend's."""
    return START_MINUTES + math.ceil(MARGIN * train_samples / INDEX_SAMPLES_PER_S / 60)


def export_minutes(parameters: int) -> int:
    """export_model: the checkpoint's weights read and the Hugging Face files written, each
    in fp32 at most (4 bytes a parameter)."""
    return START_MINUTES + math.ceil(MARGIN * 8 * parameters / EXPORT_BYTES_PER_S / 60)


def cpu_job_minutes(fixed: int, sized: int, whole_nodes: bool, max_minutes: int) -> int:
    """The limit a CPU-only job asks for: ``sized`` where it holds GPU nodes
    (``whole_nodes``), else ``fixed`` or more where the work needs it; at most the
    site's longest."""
    minutes = sized if whole_nodes else max(fixed, sized)
    return min(minutes, max_minutes)
