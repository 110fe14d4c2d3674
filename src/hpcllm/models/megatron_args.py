"""The command line of Megatron-LM's ``pretrain_gpt.py`` for an experiment.

Megatron-LM's flags drift between versions (the OpenGPT-X report's appendix passes
``--data-impl mmap``, which later versions reject as an unrecognized argument), so the
flag names live in one table per supported Megatron-LM commit. ``MEGATRON_LM_COMMIT`` is
the one pin: the container recipes build the same commit (envs/*.def, checked by
``container_commit_mismatch``). tests/data/megatron_flags.txt is every flag of the pinned
commit's parser, made independently of this table (scripts/megatron_lm_parser.py), and
the tests check every generated flag against it, and run Megatron-LM's own ``parse_args``
and ``validate_args`` on every generated command line (tests/training/
test_megatron_conformance.py, with the installed release: hpcllm.models.megatron_compat).
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Any

from hpcllm.clusters import MEGATRON_IN_IMAGE
from hpcllm.models.planner import Layout

# The Megatron-LM commit the workflow generates arguments for and the container installs:
# the release tag core_v0.19.0 (Megatron Core 0.19.0, August 2026). Its pyproject needs
# Python >= 3.12 and torch >= 2.6; its own CI's long-term-support image is NGC PyTorch
# 25.09 (docker/.ngc_version.lts), which envs/megatron-nvidia.def builds on. On AMD GPUs
# (LUMI) the same commit runs without Transformer Engine: ``--transformer-impl local``.
MEGATRON_LM_REPO = "https://github.com/NVIDIA/Megatron-LM.git"
MEGATRON_LM_COMMIT = "5be9626709af2722333bf54797c954c09edeada3"
MEGATRON_LM_RELEASE = "core_v0.19.0"
# The workflow's own Megatron processes (prepare_data_cache's index builder, the export's
# reader, the model checks, the conformance tests) run the same release from the package
# index, megatron-core megatron_compat.MEGATRON_CORE, on Python 3.11:
# hpcllm.models.megatron_compat is the one shim that needs, and says why.

# Logical option -> flag, per commit. A logical option missing from a version's table is
# not supported by that version and refused, instead of passed to fail at start-up. At
# core_v0.19.0 most flags are generated from config dataclasses (ArgumentGroupFactory in
# megatron/training/arguments.py); tests/data/megatron_flags.txt lists them all.
FLAGS: dict[str, dict[str, str]] = {
    MEGATRON_LM_COMMIT: {
        "num_layers": "--num-layers",
        "hidden_size": "--hidden-size",
        "ffn_hidden_size": "--ffn-hidden-size",
        "num_attention_heads": "--num-attention-heads",
        "seq_length": "--seq-length",
        "max_position_embeddings": "--max-position-embeddings",
        "position_embedding_type": "--position-embedding-type",
        "make_vocab_size_divisible_by": "--make-vocab-size-divisible-by",
        "transformer_impl": "--transformer-impl",
        "no_rope_fusion": "--no-rope-fusion",
        "no_gradient_accumulation_fusion": "--no-gradient-accumulation-fusion",
        "no_masked_softmax_fusion": "--no-masked-softmax-fusion",
        "no_persist_layer_norm": "--no-persist-layer-norm",
        "attention_backend": "--attention-backend",
        "tensor_model_parallel_size": "--tensor-model-parallel-size",
        "pipeline_model_parallel_size": "--pipeline-model-parallel-size",
        "sequence_parallel": "--sequence-parallel",
        "use_distributed_optimizer": "--use-distributed-optimizer",
        "overlap_grad_reduce": "--overlap-grad-reduce",
        "overlap_param_gather": "--overlap-param-gather",
        "dist_ckpt_optim_fully_reshardable": "--dist-ckpt-optim-fully-reshardable",
        "recompute_granularity": "--recompute-granularity",
        "recompute_method": "--recompute-method",
        "recompute_num_layers": "--recompute-num-layers",
        "micro_batch_size": "--micro-batch-size",
        "global_batch_size": "--global-batch-size",
        "train_iters": "--train-iters",
        "exit_interval": "--exit-interval",
        "exit_duration_in_mins": "--exit-duration-in-mins",
        "exit_signal_handler": "--exit-signal-handler",
        "exit_signal": "--exit-signal",
        "bf16": "--bf16",
        "fp16": "--fp16",
        "optimizer": "--optimizer",
        "adam_beta1": "--adam-beta1",
        "adam_beta2": "--adam-beta2",
        "weight_decay": "--weight-decay",
        "clip_grad": "--clip-grad",
        "lr": "--lr",
        "min_lr": "--min-lr",
        "lr_decay_style": "--lr-decay-style",
        "lr_warmup_iters": "--lr-warmup-iters",
        "attention_dropout": "--attention-dropout",
        "hidden_dropout": "--hidden-dropout",
        "seed": "--seed",
        "data_path": "--data-path",
        "mock_data": "--mock-data",
        "split": "--split",
        "data_cache_path": "--data-cache-path",
        "tokenizer_type": "--tokenizer-type",
        "tokenizer_model": "--tokenizer-model",
        "vocab_size": "--vocab-size",
        "save": "--save",
        "load": "--load",
        "save_interval": "--save-interval",
        "log_interval": "--log-interval",
        "log_throughput": "--log-throughput",
        "log_straggler": "--log-straggler",
        "straggler_minmax_count": "--straggler-minmax-count",
        "tensorboard_dir": "--tensorboard-dir",
        "eval_interval": "--eval-interval",
        "eval_iters": "--eval-iters",
        "distributed_backend": "--distributed-backend",
    },
}

# The environment of every Megatron process: with tensor or sequence parallelism (before
# Blackwell) Megatron-LM refuses to start without one CUDA work queue per device.
MEGATRON_ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}

# Megatron's own layers (no Transformer Engine, unfused attention) where TE is missing.
TRANSFORMER_IMPL = {"nvidia": "transformer_engine", "amd": "local"}


def transformer_impl_for(cluster) -> str:
    """``--transformer-impl`` for a cluster (:func:`transformer_impl_and_reason`)."""
    return transformer_impl_and_reason(cluster)[0]


def transformer_impl_and_reason(cluster) -> tuple[str, str]:
    """``--transformer-impl`` for a cluster and why: its fact ``transformer_engine`` where
    given; else, where jobs run a ``megatron_lm`` checkout without a container (on this
    environment's Python: hpcllm.launch.python_for), whether that Python has Transformer
    Engine (without it the default layers stop at model set-up: "apply_rope_fusion is not
    available. Please install TE >= 1.4"); else by the GPU vendor (the ROCm image has no
    Transformer Engine, the NVIDIA images have it)."""
    where = getattr(cluster, "path", None) or "the cluster file"
    has_te = getattr(cluster, "transformer_engine", None)
    if has_te is not None:
        impl = "transformer_engine" if has_te else "local"
        return impl, f"{where}: transformer_engine: {str(has_te).lower()}"
    if runs_checkout(cluster):
        if has_transformer_engine():
            return "transformer_engine", f"Transformer Engine is installed in {sys.executable}"
        return "local", (
            f"the jobs' Python ({sys.executable}, which runs the megatron_lm checkout) has "
            "no Transformer Engine (no module transformer_engine): install it there for "
            f"TE's layers, or say transformer_engine: false in {where}"
        )
    vendor = cluster.gpu.vendor if getattr(cluster, "gpu", None) is not None else "nvidia"
    impl = TRANSFORMER_IMPL.get(vendor, "transformer_engine")
    has = "has no" if impl == "local" else "has"
    return impl, f"the {vendor} training image {has} Transformer Engine ({where}: gpu.vendor)"


def runs_checkout(cluster) -> bool:
    """Whether the megatron engine's jobs run the cluster's ``megatron_lm`` checkout (no
    container) on this environment's Python."""
    no_container = getattr(cluster, "container_runtime", "none") == "none"
    return no_container and getattr(cluster, "megatron_lm", None) is not None


def has_transformer_engine() -> bool:
    """Whether this Python has Transformer Engine (found, not imported: importing it
    needs CUDA, which a login node lacks)."""
    from importlib.util import find_spec

    return find_spec("transformer_engine") is not None


def pretrain_gpt_program(python: str, megatron_dir: str) -> list[str]:
    """The program before ``pretrain_gpt.py``'s arguments: the image's script as it is
    (Python 3.12); a checkout's through hpcllm's shim (hpcllm.models.megatron_compat),
    as its jobs run on this environment's Python, 3.11, which the release's
    ``typing.override`` import needs the shim for."""
    script = f"{megatron_dir}/pretrain_gpt.py"
    if megatron_dir == MEGATRON_IN_IMAGE:
        return [python, script]
    return [python, "-m", "hpcllm.models.megatron_compat", script]


def as_run(
    experiment: dict[str, Any], transformer_impl: str, resumes: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """The experiment as Megatron-LM runs it with ``transformer_impl``, and what of it
    that drops. Megatron's local layers (the ROCm image: no Transformer Engine, no apex)
    run without sequence parallelism (torch's norm refuses it) and with unfused attention,
    which keeps the score matrix (``--attention-backend flash`` needs TE).

    A run that ``resumes`` from checkpoints (training, not a benchmark point) also runs
    there without the distributed optimizer: with neither TE's nor Apex's fused Adam,
    Megatron falls back to torch's AdamW, whose state is still empty when a checkpoint
    loads, and ``DistributedOptimizer.state_dict`` asserts one ``step`` in it
    (distrib_optimizer.py, "Extract 'step', for non-Apex/TE support"): every resume stops
    at start-up (seen on an H200 without TE or Apex; tests/training/
    test_distributed_optimizer.py reproduces it with Megatron's code on the CPU).

    The memory planner counts what runs, not what the experiment asks for."""
    if transformer_impl != "local":
        return experiment, []
    lay, model = experiment["layout"], experiment["model"]
    no_fused_adam = resumes and bool(lay.get("distributed_optimizer"))
    dropped = [
        what
        for what, asked in (
            ("sequence parallelism", lay.get("sequence_parallel")),
            ("flash attention", model.get("flash_attention")),
            ("the distributed optimizer", no_fused_adam),
        )
        if asked
    ]
    runs_layout = {**lay, "sequence_parallel": False}
    if resumes:  # nor does the planner suggest it (planner._suggestion)
        runs_layout.update(distributed_optimizer=False, fused_adam=False)
    runs = {**experiment, "layout": runs_layout, "model": {**model, "flash_attention": False}}
    return runs, dropped


# The version in the pinned commit's megatron/core/package_info.py: what an archive of the
# tree (no .git to ask for its commit) shows. Not the wheel's: PyPI's megatron-core 0.19.0
# was built from the same tree with 0.19.0 written there.
PIN_PACKAGE_VERSION = "0.19.1"


def checkout_problem(tree: str | Path) -> str | None:
    """Why the Megatron-LM checkout ``tree`` (a cluster's ``megatron_lm``) cannot run the
    command lines generated for the pin, or None: not a Megatron-LM tree, another commit
    or release, or its dataset helpers not built for this Python (rank 0 would compile
    them at start-up, with a compiler and Python headers a compute node may lack)."""
    tree = Path(tree)
    where = f"megatron_lm {tree}"
    if not (tree / "pretrain_gpt.py").is_file():
        return f"{where}: no pretrain_gpt.py there; name a Megatron-LM checkout"
    head = _git_head(tree)
    if head is not None and head != MEGATRON_LM_COMMIT:
        return (
            f"{where}: is at commit {head[:12]}, but the arguments are generated for "
            f"{MEGATRON_LM_COMMIT[:12]} ({MEGATRON_LM_RELEASE}): "
            f"`git -C {tree} checkout {MEGATRON_LM_RELEASE}`"
        )
    release = _package_release(tree)
    if head is None and release != PIN_PACKAGE_VERSION:
        return (
            f"{where}: megatron/core/package_info.py says {release or 'no version'}, the "
            f"pin's says {PIN_PACKAGE_VERSION} ({MEGATRON_LM_RELEASE}, "
            f"{MEGATRON_LM_COMMIT[:12]}); check out that commit"
        )
    # Jobs without a container run this Python (hpcllm.launch.python_for): its build.
    python = python_problem()
    if python is not None:
        return f"{where}: {python}"
    helpers = tree / "megatron" / "core" / "datasets" / f"helpers_cpp{_extension_suffix()}"
    if not helpers.is_file():
        return (
            f"{where}: its dataset helpers are not built for this Python ({helpers} is "
            f"missing); build them once where a compiler is: `make -C {helpers.parent}` "
            "with this environment's python3 first on the PATH"
        )
    return None


def python_problem() -> str | None:
    """Why this Python (the bare-metal jobs') cannot run the pin's Megatron-LM, or None.
    The pin asks for Python >= 3.12 (its pyproject); on 3.11 its one gap,
    ``typing.override``, is filled from typing_extensions (hpcllm.models.megatron_compat,
    the jobs' program: :func:`pretrain_gpt_program`), which has it from 4.4 on."""
    if sys.version_info >= (3, 12):
        return None
    version = ".".join(map(str, sys.version_info[:3]))
    fix = (
        f"the pin ({MEGATRON_LM_RELEASE}) needs Python >= 3.12, or 3.11 with "
        "typing_extensions >= 4.4 (hpcllm.models.megatron_compat); run the workflow from "
        "such an environment"
    )
    if sys.version_info < (3, 11):
        return f"the jobs' Python {sys.executable} is {version}: {fix}"
    try:
        from typing_extensions import override  # noqa: F401
    except ImportError:
        return (
            f"the jobs' Python {sys.executable} ({version}) has no typing_extensions.override: "
            f"{fix} (pip install 'typing_extensions>=4.4')"
        )
    return None


def _extension_suffix() -> str:
    import sysconfig

    return sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def _git_head(tree: Path) -> str | None:
    """The checkout's commit where it is a git work tree (an archive has none)."""
    import subprocess

    if not (tree / ".git").exists():
        return None
    done = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() if done.returncode == 0 else None


def _package_release(tree: Path) -> str | None:
    """MAJOR.MINOR.PATCH from the tree's megatron/core/package_info.py (read, not run)."""
    try:
        text = (tree / "megatron" / "core" / "package_info.py").read_text()
    except OSError:
        return None
    parts = [re.search(rf"^{k}\s*=\s*(\d+)", text, re.M) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(p.group(1) for p in parts) if all(parts) else None


class MegatronArgsError(ValueError):
    """An experiment that the pinned Megatron-LM version cannot express."""


def container_commit_mismatch(definition_text: str, where: str) -> str | None:
    """A message when a container recipe builds or labels another commit than the pin."""
    found = re.search(r"MEGATRON_COMMIT=([0-9a-f]{7,40})", definition_text)
    if found is None:
        return f"{where}: names no MEGATRON_COMMIT; the megatron engine cannot check its flags"
    if found.group(1) != MEGATRON_LM_COMMIT:
        return (
            f"{where}: builds Megatron-LM {found.group(1)[:12]}, but the arguments are "
            f"generated for {MEGATRON_LM_COMMIT[:12]} ({MEGATRON_LM_RELEASE}, "
            "hpcllm.models.megatron_args); build that commit, or move the pin and its "
            "flag table (and tests/data/megatron_flags.txt) to this one"
        )
    label = re.search(r"org\.hpcllm\.megatron-commit\s+(\S+)", definition_text)
    if label is None or label.group(1) != MEGATRON_LM_COMMIT:
        return (
            f"{where}: its label org.hpcllm.megatron-commit is "
            f"{label.group(1) if label else 'missing'}, not the commit it builds "
            f"({MEGATRON_LM_COMMIT}); label the image with what it contains"
        )
    return None


def exit_duration_minutes(remaining_seconds: float | None, margin_seconds: float) -> int | None:
    """``--exit-duration-in-mins`` (an integer in Megatron) from the job's time left."""
    if remaining_seconds is None:
        return None
    minutes = math.floor((remaining_seconds - margin_seconds) / 60)
    if minutes < 1:
        raise MegatronArgsError(
            f"the job has {remaining_seconds:.0f} s left, less than the safety margin of "
            f"{margin_seconds:.0f} s plus one minute of training; give the segment more time "
            "(runtime resource) or lower training.experiments.*.time.margin_seconds"
        )
    return minutes


def pretrain_gpt_args(
    experiment: dict[str, Any],
    layout: Layout,
    *,
    data_path: list[str],
    split: str,
    save: str | None,
    tensorboard_dir: str | None,
    data_cache_path: str | None,
    train_iters: int,
    stop_iteration: int,
    exit_minutes: int | None,
    transformer_impl: str = "transformer_engine",
    tokenizer_model: str | None = None,
    straggler_log: bool = False,
    commit: str = MEGATRON_LM_COMMIT,
) -> list[str]:
    """The arguments after ``pretrain_gpt.py`` (the launch builder adds the rest).

    ``data_path=None`` trains on Megatron's mock data with its ``NullTokenizer`` (no
    vocabulary files); ``save=None`` writes no checkpoint (Megatron saves at the end
    whenever ``--save`` is set) and loads none. ``tokenizer_model``: the folder holding
    the tokenizer's ``tokenizer.json`` and ``tokenizer_config.json``, read offline by
    ``HuggingFaceTokenizer``; a dataset needs one. Never ``GPT2BPETokenizer``: at this pin
    it is ``AutoTokenizer.from_pretrained("gpt2", vocab_file=..., merges_file=...)``, which
    asks the hub at start-up (compute nodes have no internet) and takes a gpt2 snapshot in
    HF_HOME over the given files, another vocabulary than the data's.
    ``straggler_log``: Megatron's straggler detector, every ``--log-interval`` iterations
    (only where the image can run it: hpcllm.models.megatron_resiliency).
    """
    if commit not in FLAGS:
        raise MegatronArgsError(
            f"Megatron-LM commit {commit} has no flag table; supported: {', '.join(FLAGS)}"
        )
    table = FLAGS[commit]
    experiment, _ = as_run(experiment, transformer_impl, resumes=save is not None)
    model, lay, optim = experiment["model"], experiment["layout"], experiment["optim"]
    args: list[str] = []

    def add(option: str, value: Any = True) -> None:
        if option not in table:
            raise MegatronArgsError(f"Megatron-LM {commit[:8]} has no option for {option}")
        if value is True:
            args.append(table[option])
        elif isinstance(value, list):
            args.extend([table[option], *map(str, value)])
        elif value is not None and value is not False:
            args.extend([table[option], f"{value:g}" if isinstance(value, float) else str(value)])

    add("num_layers", model["num_layers"])
    add("hidden_size", model["hidden_size"])
    add("ffn_hidden_size", model.get("ffn_hidden_size"))
    add("num_attention_heads", model["num_attention_heads"])
    add("seq_length", model["seq_length"])
    add("max_position_embeddings", model["seq_length"])
    add("position_embedding_type", model.get("position_embedding", "rope"))
    add("make_vocab_size_divisible_by", 128)
    add("transformer_impl", transformer_impl)
    if transformer_impl == "local":
        # Fusions that are on by default at the pin but need kernels the ROCm image lacks:
        # RoPE fusion needs Transformer Engine ("apply_rope_fusion is not available" at the
        # first forward), gradient accumulation fusion apex's fused_weight_gradient_mlp_cuda
        # (ColumnParallelLinear raises), the masked-softmax fusion Megatron's compiled
        # scaled_masked_softmax_cuda (imported on fp16 and bf16 runs). Without apex the
        # local layers use torch's norm (WrappedTorchNorm), which refuses the persistent
        # layer norm that is on by default ("persist_layer_norm not supported by torch
        # LayerNorm", megatron/core/transformer/torch_norm.py at the pin) and sequence
        # parallelism ("sequence parallel not supported by torch LayerNorm"): both off.
        # The bias-dropout/GELU/SwiGLU fusions are TorchScript: kept.
        # tests/training/test_megatron_model_cpu.py builds these models without TE/apex.
        add("no_rope_fusion")
        add("no_gradient_accumulation_fusion")
        add("no_masked_softmax_fusion")
        add("no_persist_layer_norm")
    add("tensor_model_parallel_size", layout.tp)
    add("pipeline_model_parallel_size", layout.pp)
    # (not with Megatron's local layers: torch's norm refuses it without apex, above; as_run)
    add("sequence_parallel", bool(lay.get("sequence_parallel")))
    distributed_optimizer = bool(lay.get("distributed_optimizer"))
    add("use_distributed_optimizer", distributed_optimizer)
    # Both off by default at the pin: then the gradient reduce-scatter runs after the whole
    # backward pass and the distributed optimizer's parameter all-gather before the next
    # forward, exposed, a share of each step that grows in strong scaling as the compute
    # per GPU shrinks. With them Megatron overlaps both in buckets with backward/forward;
    # it refuses the gather without the distributed optimizer or the grad overlap
    # (validate_args).
    overlap = layout.dp > 1
    add("overlap_grad_reduce", overlap)
    add("overlap_param_gather", overlap and distributed_optimizer)
    # The distributed optimizer's checkpoints in the format any TP/PP/DP loads, where the
    # campaign asks for it (hpcllm.training.plan.reshard: what each format survives).
    fully = distributed_optimizer and save is not None and wants_fully_reshardable(experiment)
    add("dist_ckpt_optim_fully_reshardable", fully)
    if model.get("flash_attention"):  # (TE's; as_run turns it off for the local layers)
        add("attention_backend", "flash")
    recompute = lay.get("recompute", "none")
    if recompute == "selective":
        add("recompute_granularity", "selective")
    elif recompute == "full":
        add("recompute_granularity", "full")
        add("recompute_method", "uniform")
        add("recompute_num_layers", 1)
    add("micro_batch_size", layout.micro_batch)
    add("global_batch_size", layout.global_batch)
    add("train_iters", train_iters)
    add("exit_interval", stop_iteration if stop_iteration < train_iters else None)
    add("exit_duration_in_mins", exit_minutes)
    add("exit_signal_handler")
    # The signal it saves and exits on (a signal.Signals name at the pin: its
    # TrainingConfig.exit_signal): Slurm's --signal before the limit, which torchrun
    # ignores (hpcllm.training.campaign.signal_lead). Only this one: a SIGTERM (a plain
    # scancel) ends Megatron-LM at once.
    add("exit_signal", "SIGUSR2")
    precision = experiment.get("precision", "bf16")
    add("bf16", precision == "bf16")
    add("fp16", precision == "fp16")
    add("optimizer", "adam")
    add("adam_beta1", float(optim["beta1"]))
    add("adam_beta2", float(optim["beta2"]))
    add("weight_decay", float(optim["weight_decay"]))
    add("clip_grad", float(optim["clip_grad"]))
    add("lr", float(optim["lr"]))
    add("min_lr", float(optim["min_lr"]))
    add("lr_decay_style", "cosine")
    add("lr_warmup_iters", optim["warmup_iters"])
    add("attention_dropout", 0.0)
    add("hidden_dropout", 0.0)
    add("seed", experiment.get("seed", 1234))
    if data_path is None:
        add("mock_data")
    else:
        add("data_path", data_path)
    add("split", split)
    add("data_cache_path", data_cache_path)
    if tokenizer_model is not None:
        add("tokenizer_type", "HuggingFaceTokenizer")
        add("tokenizer_model", tokenizer_model)
    elif data_path is not None:
        raise MegatronArgsError(
            "a dataset needs its tokenizer's folder (tokenizer.json and tokenizer_config.json)"
        )
    else:
        add("tokenizer_type", "NullTokenizer")
        add("vocab_size", model.get("vocab_size") or 50257)
    if save is not None:
        add("save", save)
        add("load", save)
        add("save_interval", experiment["save_interval"])
    add("log_interval", experiment.get("log_interval", 1))
    add("log_throughput")
    if straggler_log:  # its lines: hpcllm.training.engines.megatron_stragglers
        from hpcllm.models.megatron_resiliency import straggler_minmax_count

        add("log_straggler")
        add("straggler_minmax_count", straggler_minmax_count(layout.gpus))
    add("tensorboard_dir", tensorboard_dir)
    add("eval_interval", experiment.get("eval_interval") or train_iters)
    add("eval_iters", experiment.get("eval_iters", 0))
    add("distributed_backend", "nccl")
    return args


# The experiment key (workflow/schemas/training.schema.yaml): auto, true or false.
RESHARDABLE_KEY = "reshardable_checkpoints"


def layout_may_change(experiment: dict[str, Any]) -> bool:
    """Whether the campaign's layout is expected to change between segments: an
    automatically chosen layout (``layout.auto``, the layout search) may be chosen again
    on another site or node count. The hook for ``reshardable_checkpoints: auto``."""
    layout = experiment.get("layout")
    return layout == "auto" or (isinstance(layout, dict) and bool(layout.get("auto")))


def wants_fully_reshardable(experiment: dict[str, Any]) -> bool:
    """``layout.reshardable_checkpoints``: true, false, or auto (the default): fully
    reshardable where the layout may change (:func:`layout_may_change`), else Megatron's
    faster default (hpcllm.training.plan.reshard: what each format survives)."""
    asked = experiment.get("layout", {}).get(RESHARDABLE_KEY, "auto")
    return layout_may_change(experiment) if asked == "auto" else bool(asked)
