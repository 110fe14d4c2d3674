"""Put a completed directory in place of an older one.

``hpcllm.atomic.atomic_paths`` renames with ``os.replace``, which cannot replace a
directory that is not empty (a repack outside Snakemake, which removes outputs first).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def replace_dir(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``; an existing ``final`` is moved aside first and removed
    after, so ``final`` is never a mix of both (it is briefly absent)."""
    if final.exists():
        old = final.with_name(final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
