"""Megatron-LM's own argument parser, run on this CPU-only machine.

Its uses, all against the pinned Megatron-LM: the installed release (megatron-core, whose
``megatron.core`` and ``megatron.training`` are the pin's), or a Megatron-LM tree at the
pin (``git archive <commit> | tar -x -C DIR``) first on ``PYTHONPATH``; ``datasets``
(``pretrain_gpt.py``) and ``initialize`` (the helpers' Makefile) need the tree:

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
  initialize:  read one case from stdin (a training segment's command line) and start
          Megatron-LM as pretrain_gpt.py does on rank 0, up to its first GPU call:
          ``parse_and_validate_args`` (global variables, tokenizer, timers) at the case's
          world size, then ``initialize_megatron`` as this one process (``allow_no_cuda``;
          gloo for NCCL, its parallel groups of one made beforehand, as Megatron makes them
          only with GPUs): the rerun state machine, random seeds and
          ``_compile_dependencies``, which runs ``make`` in the tree's
          megatron/core/datasets (pybind11 and a C++ compiler needed, or a helpers module
          built before, as the images build it) and then imports its helpers. Print JSON:
          the helpers module's file and the start-up log.
  model:  read {"without": [module, ...], "cases": [...]} from stdin. For each case:
          what ``parse`` does with the full command line at its world size ("parsed")
          and its ``core_transformer_config_from_args`` (the config checks at the real
          sizes); then the command line scaled down (hpcllm.training.engines.megatron_model's
          ``TINY``: 2 layers, hidden size 64, 32 tokens, one process, TP = PP = 1,
          ``--use-cpu-initialization``, gloo; every other flag as generated) through
          the same, its tokenizer, ``gpt_config_from_args`` and ``GPTModelBuilder``
          (pretrain_gpt.py's path), building the GPT model on the CPU with the full
          command line's sequence parallelism, and one micro-batch forward and backward.
          ``without``: modules the target image lacks (Transformer Engine and apex in
          LUMI's ROCm image), made unimportable before Megatron is imported, so a fusion
          that needs them fails as it would there. A Transformer Engine command line
          gets its config only (TE cannot be installed on a CPU machine; its fused RoPE
          counts as present, as in the NVIDIA image). Prints per case the error or
          "model": "built" with the parameter count and loss, the TransformerConfig
          fields that differ from the dataclass's defaults, and "differ": the fields
          where hpcllm.training.engines.megatron_model's derivation (what the CPU test builds
          without Megatron-LM) differs from Megatron-LM's.

On Python < 3.12 ``hpcllm.models.megatron_compat.enable`` runs first (the release's
training modules import ``typing.override``; that module is the one place that says
why). Stubbed, because it cannot exist here (and for ``model``, the forward pass's CUDA
calls answered by the CPU: ``megatron_model.cuda_is_the_cpu``): the one device query of
``validate_args``, ``get_device_arch_version`` (CUDA), answered as a Hopper GPU (9), the
newest generation whose rules our clusters share.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import traceback
from pathlib import Path


def megatron_arguments():
    from hpcllm.models.megatron_compat import enable

    enable()
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
    from megatron.core import package_info

    return {
        "megatron_core": package_info.__shortversion__,
        "samples": list(samples),
        "sizes": [len(d) if d is not None else 0 for d in built],
        "eod": config.tokenizer.eod,
        "before": before,
        "after": sorted(p.name for p in cache.iterdir()),
        "log": log.getvalue()[-3000:],
    }


def initialize(case: dict) -> dict:
    """pretrain_gpt.py's start-up on rank 0 before its first GPU call (see the docstring)."""
    import torch.distributed as dist

    arguments = megatron_arguments()
    arguments.get_device_arch_version = lambda: 9
    os.environ.update({**case.get("env", {}), "RANK": "0", "WORLD_SIZE": str(case["world_size"])})
    sys.argv = ["pretrain_gpt.py", *case["argv"]]
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        # pretrain_gpt.py's own call (its __main__), then pretrain()'s initialize_megatron
        arguments.parse_and_validate_args(args_defaults={"tokenizer_type": "GPT2BPETokenizer"})
        from megatron.core import parallel_state
        from megatron.training.initialize import initialize_megatron

        # This process is rank 0 in a world of one (the helpers are compiled on rank 0
        # while the others wait at a barrier), on gloo, as NCCL needs GPUs; its parallel
        # groups are made here, as initialize_megatron makes them only with GPUs.
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
        try:
            initialize_megatron(allow_no_cuda=True)
            from megatron.core.datasets import helpers_cpp
        finally:
            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()
    return {"helpers": helpers_cpp.__file__, "log": log.getvalue()[-3000:]}


def _value(v):
    """A config field's value as JSON: functions by their qualified name."""
    if callable(v):
        return f"{getattr(v, '__module__', '')}.{getattr(v, '__qualname__', repr(v))}"
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    return repr(v)


def config_fields(config) -> dict:
    """The fields of ``config`` whose values differ from its dataclass's defaults."""
    import dataclasses

    out = {}
    for f in dataclasses.fields(config):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        value = getattr(config, f.name)
        if default is dataclasses.MISSING or _value(value) != _value(default):
            out[f.name] = _value(value)
    return out


def _rope_fusion_present():
    """Transformer Engine's fused RoPE, as the NVIDIA image has it (TE is not importable
    on this machine: its kernels need CUDA): a stand-in that is never called, since the
    model of a Transformer Engine command line is not built here."""
    from megatron.core.models.common.embeddings import rope_utils

    rope_utils.fused_apply_rotary_pos_emb = rope_utils.fused_apply_rotary_pos_emb or object()


def te_importable() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("transformer_engine") is not None
    except ModuleNotFoundError:
        return False


def build_tiny_model(args, sequence_parallel: bool, argv: list[str]) -> dict:
    """pretrain_gpt.py's model for ``args`` on one CPU process, a micro-batch through it.
    ``sequence_parallel``: the full-size command line's (validate_args turns it off at
    TP = 1; the layers are built with it, as on the cluster). ``argv``: the scaled-down
    command line, without the ``--use-cpu-initialization`` of this machine."""
    from megatron.training import global_vars
    from megatron.training.arguments import core_transformer_config_from_args

    from hpcllm.training.engines.megatron_model import materialize, transformer_config_kwargs

    global_vars._build_tokenizer(args)  # sets padded_vocab_size
    config = core_transformer_config_from_args(args)
    # hpcllm's derivation of the same config (what the CPU test builds without Megatron-LM)
    mine = materialize({**transformer_config_kwargs(argv), "use_cpu_initialization": True})
    for c in (config, mine):
        c.sequence_parallel = sequence_parallel
    theirs, mine = config_fields(config), config_fields(mine)
    differ = {k: [theirs.get(k), mine.get(k)] for k in theirs.keys() | mine.keys()
              if theirs.get(k) != mine.get(k)}  # fmt: skip
    result = {"ok": True, "fields": theirs, "differ": differ}
    if args.transformer_impl == "transformer_engine" and not te_importable():
        return {**result, "model": "not built: Transformer Engine is not importable here"}
    try:
        return {**result, **_tiny_model_forward_backward(args, config)}
    except Exception as exc:
        return {**result, "ok": False, "error": _error(exc, io.StringIO())}


def _tiny_model_forward_backward(args, config) -> dict:
    import torch
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.module import Float16Module
    from megatron.training.argument_utils import gpt_config_from_args
    from megatron.training.models.gpt import GPTModelBuilder

    from hpcllm.training.engines.megatron_model import cuda_is_the_cpu

    model_config = gpt_config_from_args(args, config)
    model_config.finalize()
    parallel_state.initialize_model_parallel(1, 1)
    try:
        with cuda_is_the_cpu():
            pg = ProcessGroupCollection.use_mpu_process_groups()
            builder = GPTModelBuilder(model_config)
            model = builder.build_model(pg, pre_process=True, post_process=True)
            params = sum(p.numel() for p in model.parameters())
            if args.fp16 or args.bf16:  # as training.get_model wraps it
                model = Float16Module(config, model)
            batch, seq = args.micro_batch_size, args.seq_length
            tokens = torch.randint(0, args.padded_vocab_size, (batch, seq))
            position_ids = torch.arange(seq).unsqueeze(0).expand(batch, seq)
            mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool)).logical_not()[None, None]
            loss = model(tokens, position_ids, mask, labels=tokens).float().mean()
            loss.backward()
    finally:
        parallel_state.destroy_model_parallel()
    return {"model": "built", "parameters": params, "loss": float(loss)}


def _error(exc: BaseException, out: io.StringIO) -> str:
    if isinstance(exc, SystemExit):  # argparse: unknown or malformed flag
        return f"exit {exc.code}: {out.getvalue()[-600:]}"
    frames = traceback.extract_tb(exc.__traceback__)
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames[::-1][:4])
    return f"{type(exc).__name__}: {exc} (at {where})"


def model(request: dict) -> list[dict]:
    """The scaled-down model of each case (see the module's docstring)."""
    import torch.distributed as dist

    from hpcllm.training.engines.megatron_model import block_imports, tiny_argv

    block_imports(request.get("without", []))
    arguments = megatron_arguments()
    arguments.get_device_arch_version = lambda: 9
    from megatron.training import global_vars

    plain = dict(os.environ)
    results = []
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for case in request["cases"]:
            out = io.StringIO()
            parsed = False
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    # the full-size command line at its world size: what ``parse`` checks
                    # (start-up included), then its TransformerConfig
                    os.environ.clear()
                    os.environ.update({**plain, **case.get("env", {}), "RANK": "0",
                                       "WORLD_SIZE": str(case["world_size"])})  # fmt: skip
                    sys.argv = ["pretrain_gpt.py", *case["argv"]]
                    full = arguments.parse_args()
                    arguments.validate_args(full)
                    start_up_checks(full)
                    parsed = True
                    if full.transformer_impl == "transformer_engine" and not te_importable():
                        _rope_fusion_present()
                    arguments.core_transformer_config_from_args(full)
                    # the scaled-down one on this process
                    os.environ["WORLD_SIZE"] = "1"
                    sys.argv = ["pretrain_gpt.py", *tiny_argv(case["argv"])]
                    args = arguments.parse_args()
                    arguments.validate_args(args)
                    global_vars._GLOBAL_ARGS = args
                    built = build_tiny_model(args, full.sequence_parallel, sys.argv[1:-1])
                results.append({"name": case["name"], "parsed": True, **built})
            except (SystemExit, Exception) as exc:
                error = _error(exc, out)
                results.append(
                    {"name": case["name"], "parsed": parsed, "ok": False, "error": error}
                )
            finally:
                global_vars._GLOBAL_ARGS = None
                global_vars._GLOBAL_TOKENIZER = None
    finally:
        dist.destroy_process_group()
    return results


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "flags":
        commit = sys.argv[2]
        print(f"# Every option of Megatron-LM {commit}'s megatron.training.arguments, made by")
        print(f"#   git -C Megatron-LM archive {commit} | tar -x -C DIR")
        print(f"#   PYTHONPATH=DIR python scripts/megatron_lm_parser.py flags {commit}")
        print("\n".join(flags()))
    elif sys.argv[1:] == ["parse"]:
        print(json.dumps(parse(json.load(sys.stdin))))
    elif sys.argv[1:] == ["model"]:
        print(json.dumps(model(json.load(sys.stdin))))
    elif sys.argv[1:] == ["initialize"]:
        print(json.dumps(initialize(json.load(sys.stdin))))
    elif sys.argv[1:] == ["datasets"]:
        print(json.dumps(datasets(json.load(sys.stdin))))
    else:
        sys.exit(__doc__)
