"""The container image's Python environment for the cluster rehearsal (a stand-in).

A real image is NGC PyTorch (or ROCm PyTorch) plus envs/requirements.txt, with no
``hpcllm`` in it. Apptainer cannot run here, so the rehearsal's image is a virtual
environment built from the same requirements file plus the base image's PyTorch (the CPU
wheel these machines carry) and nothing else: a job that imports ``hpcllm`` from the
host's environment fails in it as it would in the real image.

Built once per requirements file: the environment lies under the cache folder
(``$HPCLLM_REHEARSAL_CACHE``, default ``~/.cache/hpcllm``) in a folder named by the hash
of what went into it, and pip reuses its own download cache. A folder without its
``.complete`` marker (an interrupted build) is rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "envs" / "requirements.txt"
# The base image's PyTorch: the CPU wheel on these machines (any other pulls CUDA).
BASE_PACKAGES = ("torch==2.13.0",)
MARKER = ".complete"


def cache_root() -> Path:
    return Path(os.environ.get("HPCLLM_REHEARSAL_CACHE", Path.home() / ".cache" / "hpcllm"))


def image_key(requirements: Path = REQUIREMENTS) -> str:
    digest = hashlib.sha256(requirements.read_bytes())
    digest.update(" ".join(BASE_PACKAGES).encode())
    digest.update(f"{sys.version_info.major}.{sys.version_info.minor}".encode())
    return digest.hexdigest()[:16]


def python_env(requirements: Path = REQUIREMENTS, log=None) -> Path:
    """The image's environment (its ``bin/python``), built first if it is not there yet."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    env = root / f"rehearsal-image-{image_key(requirements)}"
    with open(root / "rehearsal-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building the same one
        if (env / MARKER).is_file():
            return env
        shutil.rmtree(env, ignore_errors=True)
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(env)], check=True, stdout=log, stderr=log)
        subprocess.run(
            [str(env / "bin" / "pip"), "install", "-q", *BASE_PACKAGES, "-r", str(requirements)],
            check=True,
            stdout=log,
            stderr=log,
        )
        (env / "requirements.txt").write_bytes(requirements.read_bytes())
        (env / MARKER).write_text(image_key(requirements) + "\n")
    return env


if __name__ == "__main__":  # build it ahead: python tests/slurm/rehearsal_image.py
    print(python_env())
