"""The one shim between the jobs' Megatron release and the workflow's Python 3.11.

Every process of the workflow that uses Megatron (prepare_data_cache's index builder and
its cache key, the export's checkpoint reader, the model checks, the conformance tests)
uses the release the GPU jobs run: megatron-core ``MEGATRON_CORE`` from the package index,
whose ``megatron/core`` and ``megatron/training`` are the pinned Megatron-LM tree
(``megatron_args.MEGATRON_LM_COMMIT``, tag ``MEGATRON_LM_RELEASE``) apart from
``package_info``. Its wheel is a cp311 build (with the dataset helpers compiled for 3.11)
but says ``Requires-Python >= 3.12``, and the workflow runs on Python 3.11: PyPI's torch
for 3.12 is the CUDA build (GBs), the pinned CPU build 2.13.0 is a 3.11 file. What the
gap needs, all of it:

- Installing: pip refuses the wheel on 3.11 unless told ``--ignore-requires-python``;
  ``--no-deps`` with it, as its dependencies (torch, numpy, packaging) come with the
  project. The Makefile's install and envs/workflow.post-deploy.sh (the conda
  environment) add that line on Python < 3.12; on 3.12 pyproject's ``train`` extra
  carries the pin itself (an environment marker).
- ``typing.override`` (new in 3.12) is the one 3.12-only API the release uses, imported
  by ``megatron/training/models/{gpt,hybrid}.py`` (reached from
  ``megatron.training.arguments``; Megatron Core itself takes the same decorator from
  ``typing_extensions``). ``enable()`` gives ``typing`` that decorator on Python < 3.12;
  call it before importing ``megatron.training``. Every other file of the pin's
  ``megatron/`` and ``tools/`` compiles on 3.11. The bare-metal jobs (a cluster's
  ``megatron_lm`` checkout, run by this environment's Python) need it too: their program
  is ``python -m hpcllm.models.megatron_compat <checkout>/pretrain_gpt.py ...``
  (:func:`run_script`; ``megatron_args.pretrain_gpt_program``), not the bare script,
  which dies at ``from typing import override`` (megatron/training/models/hybrid.py);
  the processes the script spawns get it from ``hpcllm.models.megatron_site``.
- Triton: ``import megatron.core`` reaches ``megatron/core/transformer/moe/ops/
  paged_stash.py``, which defines Triton kernels at import. Triton itself is installed
  (the ``train`` extra), not stubbed: it imports without a GPU, and a stub would have to
  follow every module of a future release that imports it.

tests/training/test_megatron_compat.py checks each point; the ``check_installed`` error
says how to install the release where it is missing or another one is installed.
"""

from __future__ import annotations

import os
import sys

# The package index's release of the pinned Megatron-LM (megatron_args.MEGATRON_LM_RELEASE).
MEGATRON_CORE = "0.19.0"
# What the release's metadata asks for; below it, enable() and --ignore-requires-python.
MEGATRON_CORE_NEEDS_PYTHON = (3, 12)
INSTALL = (
    f"pip install --no-deps --ignore-requires-python megatron-core=={MEGATRON_CORE}"
    if sys.version_info < MEGATRON_CORE_NEEDS_PYTHON
    else f"pip install megatron-core=={MEGATRON_CORE}"
)


def enable() -> None:
    """Make the release's training modules importable on this Python (idempotent)."""
    import typing

    if not hasattr(typing, "override"):  # Python < 3.12
        import typing_extensions

        typing.override = typing_extensions.override


def installed_version() -> str | None:
    """The importable Megatron Core's version, None without one."""
    from importlib.util import find_spec

    if find_spec("megatron") is None or find_spec("megatron.core") is None:
        return None
    from megatron.core import package_info  # an ImportError here is the release's own

    # The release alone: package_info appends `git rev-parse --short HEAD` run in its own
    # folder, which in a venv inside a checkout (this repository's .venv) is ours.
    return package_info.__version__.split("+", 1)[0]


def check_installed() -> str:
    """The installed Megatron Core's version; an error saying how to install the jobs'
    release where another one (or none) is importable."""
    version = installed_version()
    if version != MEGATRON_CORE:
        found = f"Megatron Core {version} is installed" if version else "No Megatron Core"
        raise ImportError(
            f"{found}: the workflow uses the GPU jobs' release {MEGATRON_CORE} ({INSTALL}; "
            "`make` does it; hpcllm.models.megatron_compat says why)"
        )
    return version


def run_script(argv: list[str]) -> None:
    """Run a Megatron-LM script as ``python SCRIPT ARGS...`` would (its folder first on
    the path, ``__main__``, ``sys.argv``), with :func:`enable` applied first, here and in
    the Python processes it starts."""
    if not argv:
        raise SystemExit(f"usage: python -m {__spec__.name} SCRIPT [ARGS...]")
    import runpy

    enable()
    # ... and in every Python process the script starts (hpcllm.models.megatron_site)
    site = os.path.join(os.path.dirname(os.path.abspath(__file__)), "megatron_site")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)
    script = os.path.abspath(argv[0])
    sys.argv = list(argv)
    # `python -m` put the working directory first; `python SCRIPT` puts SCRIPT's folder
    # there, so that its `megatron` package (the checkout's) comes before the release's.
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    run_script(sys.argv[1:])
