"""The probe's checks that run inside the image: ``python -m hpcllm.preflight.inside``.

Prints one JSON line: the image's Python, each module's import error (None: it imports),
the NCCL/RCCL network plugin libraries found on the image's library path, the torch
version with whether its torchrun has --shutdown-timeout, and the resiliency features the
image has (:func:`resiliency`). Only the standard library here: the image's Python has no
hpcllm dependencies beyond it.
"""

from __future__ import annotations

import argparse
import ctypes.util
import glob
import importlib
import importlib.metadata
import importlib.util
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


# Where the pin's Megatron-LM declares the features (megatron/training/arguments.py:
# _add_inprocess_restart_args; config/resilience_config.py: StragglerDetectionConfig,
# whose fields ArgumentGroupFactory turns into --log-straggler and its companions).
MEGATRON_FEATURES = {
    "inprocess_restart": ("training/arguments.py", "'--inprocess-restart'"),
    "log_straggler": ("training/config/resilience_config.py", "log_straggler: bool"),
}


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that is not a package, a broken spec
        return False


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def nvrx_inprocess() -> bool:
    """Whether nvidia-resiliency-ext's in-process restart package is there (what Megatron's
    --inprocess-restart imports), found without importing NVRx itself."""
    if not _found("nvidia_resiliency_ext"):
        return False
    spec = importlib.util.find_spec("nvidia_resiliency_ext")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    return any(os.path.isfile(os.path.join(d, "inprocess", "__init__.py")) for d in folders)


def megatron_features() -> dict[str, bool] | None:
    """Which resiliency options the image's Megatron-LM declares, read from its source
    (none imported); None where no megatron package is found."""
    if not _found("megatron"):
        return None
    spec = importlib.util.find_spec("megatron")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    found = {}
    for name, (path, text) in MEGATRON_FEATURES.items():
        found[name] = False
        for folder in folders:
            try:
                with open(os.path.join(folder, path), encoding="utf-8") as f:
                    found[name] = text in f.read()
            except OSError:
                continue
            if found[name]:
                break
    return found


def resiliency() -> dict:
    """What the engines' own resiliency features need, found without importing them:
    nvidia-resiliency-ext and its in-process restart (Megatron's --inprocess-restart),
    the GPU sensors' Python binding torch reads (pynvml from nvidia-ml-py; amdsmi on
    ROCm: Megatron's --log-straggler reads temperature, power and clocks through it at
    every report, and fails there without one) and the image's Megatron options."""
    return {
        "nvidia_resiliency_ext": _version("nvidia-resiliency-ext"),
        "nvrx_inprocess": nvrx_inprocess(),
        "gpu_sensors": next((m for m in ("pynvml", "amdsmi") if _found(m)), None),
        "megatron": megatron_features(),
    }


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
                "resiliency": resiliency(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
