"""Megatron-LM's own argument parser, run on this CPU-only machine.

Two uses, both against a Megatron-LM tree at the pinned commit (not on any package index;
unpack it with ``git archive <commit> | tar -x -C DIR``):

  flags COMMIT:  print every option string of ``megatron.training.arguments`` (the independent
          list tests/data/megatron_flags.txt; at this pin most flags are generated from
          config dataclasses by ``ArgumentGroupFactory``, so a grep of arguments.py misses
          them and the parser is the one source):
            git -C Megatron-LM archive COMMIT | tar -x -C DIR
            PYTHONPATH=DIR python scripts/megatron_lm_parser.py flags COMMIT \
                > tests/data/megatron_flags.txt
  parse:  read a JSON list of {"name", "argv", "world_size", "env"} from stdin, run
          Megatron-LM's ``parse_args`` and ``validate_args`` on each (with ``env``, the
          environment the job gives the engine), then build its tokenizer and its
          learning-rate schedule as pretrain_gpt.py does at start-up; print a JSON list
          of results.
  datasets:  read one such case from stdin (a training segment's command line, run in
          the workflow's working directory), and build its train, validation and test
          datasets as pretrain_gpt.py does (``core_gpt_dataset_config_from_args``, the
          sample counts of ``get_train_valid_test_num_samples``, Megatron Core's
          ``BlendedMegatronDatasetBuilder``) in a one-process group; print JSON: the
          files of ``--data-cache-path`` before and after, and the datasets' sizes. A
          cache made for this command line gains no file.

Stubbed, because they cannot exist here: Megatron's Triton kernel modules (GPU code,
imported at start-up; no Triton on a CPU torch), ``typing.override`` on Python < 3.12 (the
pin needs 3.12, the NGC image has it; ``typing_extensions`` gives the same decorator), and
the one device query of ``validate_args``, ``get_device_arch_version`` (CUDA), answered
as a Hopper GPU (9), the newest generation whose rules our clusters share.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import traceback
import types
from pathlib import Path

# Megatron modules that import triton at import time -> the names they export.
TRITON_KERNEL_MODULES = {
    "megatron.core.transformer.moe.ops.paged_stash": [
        "GLOBAL_BLOCK_SIZE",
        "paged_stash_copy_kernel",
        "paged_stash_pop_kernel",
    ],
}


def _stub_gpu_only_imports() -> None:
    import typing

    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override
    try:
        import triton  # noqa: F401
    except ImportError:
        for name, exported in TRITON_KERNEL_MODULES.items():
            module = types.ModuleType(name)
            for attr in exported:
                setattr(module, attr, None)
            sys.modules[name] = module


def megatron_arguments():
    _stub_gpu_only_imports()
    import warnings

    warnings.simplefilter("ignore")
    with contextlib.redirect_stdout(io.StringIO()):
        from megatron.training import arguments
    return arguments


def flags() -> list[str]:
    arguments = megatron_arguments()
    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    return sorted(s for s in parser._option_string_actions if s.startswith("--"))


def start_up_checks(args) -> None:
    """What pretrain_gpt.py builds from the arguments before the first GPU kernel: the
    tokenizer (its files are read) and the learning-rate schedule (warm-up shorter than
    the decay), on a stand-in optimizer."""
    import torch
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
    from megatron.training import global_vars, training

    build_tokenizer(args)
    global_vars._GLOBAL_ARGS = args
    try:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.lr or 0.0)
        training.get_optimizer_param_scheduler(optimizer)
    finally:
        global_vars._GLOBAL_ARGS = None


def parse(cases: list[dict]) -> list[dict]:
    arguments = megatron_arguments()
    results = []
    arguments.get_device_arch_version = lambda: 9
    plain = dict(os.environ)
    for case in cases:
        os.environ.clear()
        os.environ.update({**plain, **case.get("env", {})})
        os.environ["RANK"] = "0"
        os.environ["WORLD_SIZE"] = str(case["world_size"])
        sys.argv = ["pretrain_gpt.py", *case["argv"]]
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                args = arguments.parse_args()
                arguments.validate_args(args)
                start_up_checks(args)
            results.append({"name": case["name"], "ok": True})
        except SystemExit as exc:  # argparse: unknown or malformed flag
            results.append(
                {
                    "name": case["name"],
                    "ok": False,
                    "error": f"exit {exc.code}: {out.getvalue()[-600:]}",
                }
            )
        except Exception as exc:  # validate_args: assertions and value errors
            frames = traceback.extract_tb(exc.__traceback__)
            where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames[::-1][:4])
            error = f"{type(exc).__name__}: {exc} (at {where})"
            results.append({"name": case["name"], "ok": False, "error": error})
    return results


def datasets(case: dict) -> dict:
    """Megatron-LM's own dataset construction for ``case`` (see the module's docstring)."""
    import torch.distributed as dist

    arguments = megatron_arguments()
    arguments.get_device_arch_version = lambda: 9
    os.environ.update({**case.get("env", {}), "RANK": "0", "WORLD_SIZE": str(case["world_size"])})
    sys.argv = ["pretrain_gpt.py", *case["argv"]]
    with contextlib.redirect_stdout(io.StringIO()):
        args = arguments.parse_args()
        arguments.validate_args(args)
        import pretrain_gpt  # Megatron-LM's tree is on sys.path (PYTHONPATH)
        from megatron.core.datasets.blended_megatron_dataset_builder import (
            BlendedMegatronDatasetBuilder,
        )
        from megatron.core.datasets.gpt_dataset import GPTDataset
        from megatron.training import global_vars, training
    cache = Path(args.data_cache_path)
    before = sorted(p.name for p in cache.iterdir()) if cache.is_dir() else []
    global_vars._GLOBAL_ARGS = args
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):
            samples = training.get_train_valid_test_num_samples()
            config = pretrain_gpt.core_gpt_dataset_config_from_args(args)
            built = BlendedMegatronDatasetBuilder(GPTDataset, samples, lambda: True, config).build()
    except ImportError as exc:  # building an index needs Megatron's compiled helpers
        if "helpers" not in str(exc):
            raise
        sys.exit(f"Megatron-LM started building an index, so the cache did not match: {exc}")
    finally:
        dist.destroy_process_group()
        global_vars._GLOBAL_ARGS = None
    return {
        "samples": list(samples),
        "sizes": [len(d) if d is not None else 0 for d in built],
        "eod": config.tokenizer.eod,
        "before": before,
        "after": sorted(p.name for p in cache.iterdir()),
        "log": log.getvalue()[-3000:],
    }


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "flags":
        commit = sys.argv[2]
        print(f"# Every option of Megatron-LM {commit}'s megatron.training.arguments, made by")
        print(f"#   git -C Megatron-LM archive {commit} | tar -x -C DIR")
        print(f"#   PYTHONPATH=DIR python scripts/megatron_lm_parser.py flags {commit}")
        print("\n".join(flags()))
    elif sys.argv[1:] == ["parse"]:
        print(json.dumps(parse(json.load(sys.stdin))))
    elif sys.argv[1:] == ["datasets"]:
        print(json.dumps(datasets(json.load(sys.stdin))))
    else:
        sys.exit(__doc__)
