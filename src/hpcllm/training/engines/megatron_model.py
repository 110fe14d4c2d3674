"""The model a generated Megatron-LM command line asks for, built without Megatron-LM.

Megatron-LM's ``pretrain_gpt.py`` turns its arguments into Megatron Core's
``TransformerConfig`` (``core_transformer_config_from_args``) and builds a ``GPTModel``;
a fusion left on where the image lacks its kernels (RoPE fusion without Transformer
Engine, ``apply_rope_fusion is not available``) fails there, at start-up, on the
cluster. This module derives the ``TransformerConfig`` arguments from a generated
command line as the pinned Megatron-LM does (its argument defaults included, which
differ from the dataclass's for the fusions), without Megatron-LM's argument parser, and
tests build a scaled-down model from them with Megatron Core on the CPU with the modules
the image lacks made unimportable (tests/training/test_megatron_model_cpu.py). The
conformance test checks that this derivation equals Megatron-LM's own, field by field
(scripts/megatron_lm_parser.py ``model``).
"""

from __future__ import annotations

from typing import Any

from hpcllm.models.megatron_args import FLAGS, MEGATRON_LM_COMMIT

# What each image lacks of what Megatron-LM imports when present. The ROCm image
# (envs/megatron-rocm.def, --transformer-impl local) has no Transformer Engine and no
# apex, hence none of apex's compiled Megatron kernels either (apex's --cuda_ext builds
# fused_weight_gradient_mlp_cuda, scaled_*masked_softmax_cuda, fused_layer_norm_cuda).
# The NVIDIA image (NGC PyTorch) has them all.
IMAGE_LACKS: dict[str, tuple[str, ...]] = {
    "local": (
        "transformer_engine",
        "apex",
        "fused_weight_gradient_mlp_cuda",
        "scaled_masked_softmax_cuda",
        "scaled_upper_triang_masked_softmax_cuda",
        "scaled_softmax_cuda",
        "fused_layer_norm_cuda",
    ),
    "transformer_engine": (),
}

# The scaled-down model: these flags' values replaced where the command line has them;
# ``--use-cpu-initialization`` added (weights made on the CPU, not on the current CUDA
# device). Every other flag stays as generated, so the fusions and the implementation
# are the cluster's.
TINY = {
    "--num-layers": "2",
    "--hidden-size": "64",
    "--ffn-hidden-size": "256",
    "--num-attention-heads": "4",
    "--seq-length": "32",
    "--max-position-embeddings": "32",
    "--tensor-model-parallel-size": "1",
    "--pipeline-model-parallel-size": "1",
    "--micro-batch-size": "2",
    "--global-batch-size": "2",
    "--distributed-backend": "gloo",
}
TINY_VOCAB = 512  # the CPU test's vocabulary (the conformance run uses the tokenizer's)


def tiny_argv(argv: list[str]) -> list[str]:
    out = list(argv)
    for flag, value in TINY.items():
        if flag in out:
            out[out.index(flag) + 1] = value
    return [*out, "--use-cpu-initialization"]


# Per logical option of the flag table: the TransformerConfig fields it sets (a function
# of its values), or None for options that do not reach the TransformerConfig (data,
# optimizer, schedule, checkpoints, logging, batch and parallel sizes: the tiny model
# runs one process). A generated option missing here is an error: say what it does to
# the model first.
def _one(field, convert=int):
    return lambda values: {field: convert(values[0])}


CONFIG_EFFECT: dict[str, Any] = {
    "num_layers": _one("num_layers"),
    "hidden_size": _one("hidden_size"),
    "ffn_hidden_size": _one("ffn_hidden_size"),
    "num_attention_heads": _one("num_attention_heads"),
    "seq_length": None,  # the GPTModel's, not the TransformerConfig's
    "max_position_embeddings": None,
    "position_embedding_type": None,  # read in transformer_config_kwargs
    "make_vocab_size_divisible_by": None,
    "transformer_impl": _one("transformer_impl", str),
    "attention_backend": _one("attention_backend", str),
    "tensor_model_parallel_size": None,
    "pipeline_model_parallel_size": None,
    "sequence_parallel": None,  # read in transformer_config_kwargs
    "use_distributed_optimizer": None,
    "overlap_grad_reduce": None,  # DistributedDataParallelConfig's, not the model's
    "overlap_param_gather": None,
    "dist_ckpt_optim_fully_reshardable": None,
    "recompute_granularity": _one("recompute_granularity", str),
    "recompute_method": _one("recompute_method", str),
    "recompute_num_layers": _one("recompute_num_layers"),
    "micro_batch_size": None,
    "global_batch_size": None,
    "train_iters": None,
    "exit_interval": None,
    "exit_duration_in_mins": None,
    "exit_signal_handler": None,
    "exit_signal": None,
    "bf16": lambda _: {"bf16": True},
    "fp16": lambda _: {"fp16": True},
    "optimizer": None,
    "adam_beta1": None,
    "adam_beta2": None,
    "weight_decay": None,
    "clip_grad": None,
    "lr": None,
    "min_lr": None,
    "lr_decay_style": None,
    "lr_warmup_iters": None,
    "attention_dropout": _one("attention_dropout", float),
    "hidden_dropout": _one("hidden_dropout", float),
    "seed": _one("inference_sampling_seed"),
    "data_path": None,
    "mock_data": None,
    "split": None,
    "data_cache_path": None,
    "tokenizer_type": None,
    "tokenizer_model": None,
    "vocab_size": None,
    "vocab_file": None,
    "merge_file": None,
    "save": None,
    "load": None,
    "save_interval": None,
    "log_interval": None,
    "log_throughput": None,
    # the straggler detector (no field of TransformerConfig or ModelParallelConfig at the pin)
    "log_straggler": None,
    "straggler_minmax_count": None,
    "tensorboard_dir": None,
    "eval_interval": None,
    "eval_iters": None,
    "distributed_backend": None,
    "no_rope_fusion": lambda _: {"apply_rope_fusion": False},
    "no_gradient_accumulation_fusion": lambda _: {"gradient_accumulation_fusion": False},
    "no_masked_softmax_fusion": lambda _: {"masked_softmax_fusion": False},
    "no_persist_layer_norm": lambda _: {"persist_layer_norm": False},
    "no_bias_dropout_fusion": lambda _: {"bias_dropout_fusion": False},
    "no_bias_gelu_fusion": lambda _: {"bias_activation_fusion": False},
}

# TransformerConfig fields whose value in Megatron-LM at the pin comes from an argument
# default that differs from the dataclass's default (megatron/training/arguments.py: the
# "incompatible defaults in dataclass" excluded from the generated arguments, and the
# --no-*-fusion flags; argument_utils.core_transformer_config_from_args).
PIN_ARGUMENT_DEFAULTS: dict[str, Any] = {
    "apply_rope_fusion": True,  # --no-rope-fusion (only with rope position embeddings)
    "gradient_accumulation_fusion": True,  # --no-gradient-accumulation-fusion
    "masked_softmax_fusion": True,  # --no-masked-softmax-fusion
    "persist_layer_norm": True,  # not --no-persist-layer-norm
    "bias_dropout_fusion": True,  # --no-bias-dropout-fusion
    "bias_activation_fusion": True,  # --no-bias-gelu-fusion (GELU: no --swiglu)
    "attention_softmax_in_fp32": False,  # --attention-softmax-in-fp32
    "add_qkv_bias": True,  # --add-bias-linear is on, and validate_args copies it
    "deallocate_pipeline_outputs": True,
    "batch_p2p_comm": True,  # not --overlap-p2p-comm
    "cp_comm_type": "p2p",
}
# Not here: --tensor-parallel-num-weight-shards and its expert twin (default None), which
# validate_args resolves to the tensor-parallel size (times a GTP remat size of 1) and
# core_transformer_config_from_args copies; materialize resolves them for the TP the
# config is built with (the kwargs hold none: the scaled-down model is TP = 1).
WEIGHT_SHARDS = {
    "tensor_parallel_num_weight_shards": "tensor_model_parallel_size",
    "expert_tensor_parallel_num_weight_shards": "expert_tensor_parallel_size",
}


class MegatronModelError(ValueError):
    """A generated command line whose model this module cannot derive."""


def _options(argv: list[str], commit: str) -> dict[str, list[str]]:
    by_flag = {flag: option for option, flag in FLAGS[commit].items()}
    options: dict[str, list[str]] = {}
    current = None
    for word in argv:
        if word.startswith("--"):
            if word not in by_flag:
                raise MegatronModelError(f"{word} is not in the flag table of {commit[:12]}")
            current = by_flag[word]
            options[current] = []
        elif current is None:
            raise MegatronModelError(f"{word!r} before any flag")
        else:
            options[current].append(word)
    return options


def transformer_config_kwargs(argv: list[str], commit: str = MEGATRON_LM_COMMIT) -> dict[str, Any]:
    """The keyword arguments of Megatron Core's ``TransformerConfig`` that Megatron-LM at
    ``commit`` makes from ``argv`` (the arguments after ``pretrain_gpt.py``), as JSON:
    dtypes as ``"torch.<name>"``, enums as ``"<Enum>.<member>"`` (``materialize`` makes
    the objects). Sequence parallelism is not among them (see ``sequence_parallel``)."""
    options = _options(argv, commit)
    kwargs: dict[str, Any] = dict(PIN_ARGUMENT_DEFAULTS)
    for option, values in options.items():
        if option not in CONFIG_EFFECT:
            raise MegatronModelError(
                f"{FLAGS[commit][option]} ({option}): its effect on the TransformerConfig is "
                "not known to hpcllm.training.engines.megatron_model; add it to CONFIG_EFFECT"
            )
        effect = CONFIG_EFFECT[option]
        if effect is not None:
            kwargs.update(effect(values))
    if options.get("position_embedding_type", ["learned_absolute"])[0] != "rope":
        kwargs["apply_rope_fusion"] = False  # validate_args: only RoPE has it
    hidden = kwargs["hidden_size"]
    kwargs.setdefault("ffn_hidden_size", 4 * hidden)  # validate_args
    dtype = (
        "torch.bfloat16" if "bf16" in options else "torch.float16" if "fp16" in options else None
    )
    if dtype is not None:
        kwargs.update(params_dtype=dtype, pipeline_dtype=dtype)
    else:
        kwargs["pipeline_dtype"] = "torch.float32"
    if "attention_backend" in kwargs:
        kwargs["attention_backend"] = f"AttnBackend.{kwargs['attention_backend']}"
    return kwargs


def sequence_parallel(argv: list[str], commit: str = MEGATRON_LM_COMMIT) -> bool:
    """Whether Megatron-LM runs ``argv`` with sequence parallelism (asked for, and TP > 1).
    A one-process model sets it on its config after construction (TransformerConfig
    refuses it at TP = 1), so that its layers are built as on the cluster."""
    options = _options(argv, commit)
    tp = int(options.get("tensor_model_parallel_size", ["1"])[0])
    return "sequence_parallel" in options and tp > 1


def materialize(kwargs: dict[str, Any]):
    """Megatron Core's TransformerConfig from ``transformer_config_kwargs``' JSON, with the
    weight-shard counts validate_args resolves (WEIGHT_SHARDS) for its tensor-parallel size."""
    import dataclasses

    import torch
    from megatron.core.transformer import enums
    from megatron.core.transformer.transformer_config import TransformerConfig

    known = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = set(kwargs) - known
    if unknown:
        raise MegatronModelError(
            f"the installed Megatron Core's TransformerConfig has no {sorted(unknown)}"
        )
    tp = kwargs.get("tensor_model_parallel_size", 1)
    sizes = {"tensor_model_parallel_size": tp,
             "expert_tensor_parallel_size": kwargs.get("expert_tensor_parallel_size") or tp}  # fmt: skip
    out = {shards: sizes[size] for shards, size in WEIGHT_SHARDS.items()}
    for key, value in kwargs.items():
        if isinstance(value, str) and value.startswith("torch."):
            value = getattr(torch, value[len("torch.") :])
        elif isinstance(value, str) and value.startswith("AttnBackend."):
            value = enums.AttnBackend[value[len("AttnBackend.") :]]
        out[key] = value
    return TransformerConfig(**out)


def model_kwargs(argv: list[str], commit: str = MEGATRON_LM_COMMIT) -> dict[str, Any]:
    """The GPTModel's own arguments from ``argv`` (gpt_config_from_args at the pin)."""
    options = _options(argv, commit)
    return {
        "max_sequence_length": int(options["max_position_embeddings"][0]),
        "position_embedding_type": options.get("position_embedding_type", ["learned_absolute"])[0],
        "share_embeddings_and_output_weights": True,  # no --untie-embeddings-and-output-weights
        "make_vocab_size_divisible_by": int(
            options.get("make_vocab_size_divisible_by", ["128"])[0]
        ),
    }


class Unimportable:
    """A meta path finder that makes ``names`` (and their submodules) fail to import, as
    in an image that lacks them; install it before anything imports Megatron."""

    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r} (not in the image)")
        return None


def block_imports(names) -> None:
    import sys

    present = sorted(n for n in sys.modules if n.split(".")[0] in set(names))
    if present:
        raise MegatronModelError(f"already imported, cannot be made unimportable: {present}")
    if names:
        sys.meta_path.insert(0, Unimportable(names))


class cuda_is_the_cpu:
    """Megatron Core's CUDA calls in a forward and backward pass, answered by the CPU:
    ``RotaryEmbedding.get_emb`` moves its frequencies to ``torch.cuda.current_device()``,
    and the model-parallel RNG tracker (forked by dropout and by activation
    recomputation) reads and sets the CUDA generator's state."""

    def __enter__(self):
        import torch
        from megatron.core.tensor_parallel import random as tp_random

        self.saved = (torch.cuda.current_device, tp_random._get_cuda_rng_state,
                      tp_random._set_cuda_rng_state)  # fmt: skip
        torch.cuda.current_device = lambda: torch.device("cpu")
        tp_random._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
        tp_random._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
        tracker = tp_random.get_cuda_rng_tracker()
        tracker.reset()  # the state model_parallel_cuda_manual_seed adds, from the CPU's
        tracker.states_[tp_random._MODEL_PARALLEL_RNG_TRACKER_NAME] = torch.get_rng_state()
        return self

    def __exit__(self, *exc):
        import torch
        from megatron.core.tensor_parallel import random as tp_random

        (torch.cuda.current_device, tp_random._get_cuda_rng_state,
         tp_random._set_cuda_rng_state) = self.saved  # fmt: skip


def build_tiny_gpt(argv: list[str], vocab_size: int = TINY_VOCAB) -> dict[str, Any]:
    """The installed Megatron Core's GPTModel for ``tiny_argv(argv)`` with Megatron's own
    layers (``--transformer-impl local``: ``get_gpt_layer_local_spec``, as Megatron-LM's
    gpt builder picks it), built on the CPU in a one-process group, one micro-batch
    forward and backward. Returns the parameter count and the loss."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.module import Float16Module

    tiny = tiny_argv(argv)[:-1]  # without --use-cpu-initialization: set below
    kwargs = transformer_config_kwargs(tiny)
    if kwargs.get("transformer_impl") != "local":
        raise MegatronModelError("only --transformer-impl local is built here (no TE)")
    config = materialize({**kwargs, "use_cpu_initialization": True})
    config.sequence_parallel = sequence_parallel(argv)
    options = model_kwargs(tiny)
    padded = -(-vocab_size // options["make_vocab_size_divisible_by"])
    padded *= options["make_vocab_size_divisible_by"]
    parallel_state.initialize_model_parallel(1, 1)
    try:
        with cuda_is_the_cpu():
            model = GPTModel(
                config=config,
                transformer_layer_spec=get_gpt_layer_local_spec(normalization=config.normalization),
                vocab_size=padded,
                max_sequence_length=options["max_sequence_length"],
                share_embeddings_and_output_weights=options["share_embeddings_and_output_weights"],
                position_embedding_type=options["position_embedding_type"],
            )
            params = sum(p.numel() for p in model.parameters())
            if config.bf16 or config.fp16:  # as Megatron-LM's get_model wraps it
                model = Float16Module(config, model)
            batch, seq = int(TINY["--micro-batch-size"]), int(TINY["--seq-length"])
            tokens = torch.randint(0, vocab_size, (batch, seq))
            positions = torch.arange(seq).unsqueeze(0).expand(batch, seq)
            mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool)).logical_not()[None, None]
            loss = model(tokens, positions, mask, labels=tokens).float().mean()
            loss.backward()
    finally:
        parallel_state.destroy_model_parallel()
    return {"parameters": params, "loss": float(loss)}


def check_models(request: dict[str, Any]) -> list[dict[str, Any]]:
    """``build_tiny_gpt`` for each of ``request["cases"]`` ({"name", "argv"}) with the
    modules ``request["without"]`` unimportable; the error of each that fails."""
    import traceback
    import warnings

    block_imports(request.get("without", ()))
    warnings.simplefilter("ignore")
    import torch.distributed as dist

    results = []
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for case in request["cases"]:
            try:
                results.append({"name": case["name"], "ok": True, **build_tiny_gpt(case["argv"])})
            except Exception as exc:
                frames = traceback.extract_tb(exc.__traceback__)[::-1][:4]
                where = " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in frames)
                error = f"{type(exc).__name__}: {exc} (at {where})"
                results.append({"name": case["name"], "ok": False, "error": error})
    finally:
        dist.destroy_process_group()
    return results


if __name__ == "__main__":  # python -m hpcllm.training.engines.megatron_model < request.json
    import json
    import sys

    print(json.dumps(check_models(json.load(sys.stdin))))
