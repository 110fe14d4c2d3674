"""The probe's checks that run inside the image: ``python -m hpcllm.preflight.inside``.

Prints one JSON line: the image's Python, each module's import error (None: it imports),
the NCCL/RCCL network plugin libraries found on the image's library path, and the torch
version with whether its torchrun has --shutdown-timeout. Only the standard library here:
the image's Python has no hpcllm dependencies beyond it.
"""

from __future__ import annotations

import argparse
import ctypes.util
import glob
import importlib
import json
import os
import platform
import sys


def import_errors(modules: list[str]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in modules:
        try:
            importlib.import_module(name)
            found[name] = None
        except BaseException as e:  # noqa: BLE001  (a module may exit or crash on import)
            found[name] = f"{type(e).__name__}: {e}"
    return found


def net_plugins() -> list[str]:
    """NCCL/RCCL network plugin libraries (``lib*-net*.so``) on the library path."""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    found = []
    for d in dirs:
        found += sorted(glob.glob(os.path.join(d, "lib*-net*.so*")))
    return found


def torchrun_shutdown_option() -> bool | None:
    """Whether the torchrun the modules imported (``torch.distributed.run``, also under
    torchrun_jsc) has ``--shutdown-timeout``, i.e. honours TORCH_ELASTIC_SHUTDOWN_TIMEOUT
    (pytorch/pytorch PR 172596; before it, workers are killed 30 s after SIGTERM). None:
    no torchrun imported."""
    run = sys.modules.get("torch.distributed.run")
    if run is None:
        return None
    try:
        return "--shutdown-timeout" in run.get_args_parser()._option_string_actions
    except Exception:  # noqa: BLE001  (a parser of another shape: unknown)
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("modules", nargs="*")
    parser.add_argument(
        "--sys-path",
        action="append",
        default=[],
        help="folders first on sys.path "
        "(the folder of the job's program, as Python puts a script's folder first)",
    )
    args = parser.parse_args(argv)
    sys.path[:0] = args.sys_path
    print(
        json.dumps(
            {
                "python": platform.python_version(),
                "modules": import_errors(args.modules),
                "net_plugins": net_plugins(),
                "ibverbs": ctypes.util.find_library("ibverbs"),
                "torch": getattr(sys.modules.get("torch"), "__version__", None),
                "torchrun_shutdown_timeout": torchrun_shutdown_option(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
