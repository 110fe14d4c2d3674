"""The ``torch`` engine: a small causal LM trained with plain PyTorch.

For laptops, CI and one GPU. The model is Hugging Face ``transformers``' Llama (RoPE) or
GPT-2 (learned positions) with a small config; the samples come from Megatron Core's
``GPTDataset`` (``hpcllm.training.plan.data``), taken in Megatron's order (each iteration the
next ``global batch`` samples, rank ``r`` of DP taking micro batch slices like Megatron's
``MegatronPretrainingSampler``). AdamW with linear warmup and cosine decay (Megatron's
``OptimizerParamScheduler`` formula), gradient clipping, bf16 autocast, DDP under
``torchrun`` (gloo on CPU, NCCL on GPU).

The command line uses Megatron-LM's flag names (a subset), checkpoints use Megatron's
directory layout and every log line follows Megatron's ``training_log`` format, so that
resume, log parsing and aggregation treat both engines alike.

Stopping: at ``--exit-interval`` (the segment's last iteration), after
``--exit-duration-in-mins``, or on SIGTERM/SIGUSR1/SIGUSR2 (with ``--exit-signal-handler``): the
current iteration is finished, a checkpoint saved, and the process exits with 0. Whether
the segment is complete is read from the checkpoint's iteration, not from the exit code.
Without ``--exit-signal-handler`` SIGTERM ends the process at once, as it ends Megatron's.

Reproducible: Python's, NumPy's and torch's generators are seeded from ``--seed`` at the
start (Megatron's ``_set_random_seed``) and saved in every checkpoint, so that a resumed
run draws what the uninterrupted one draws (dropout included); the data order follows
from the iteration.

Run ``python -m hpcllm.training.engines.torch_engine --help``; docs/training.md has examples.
"""

from __future__ import annotations

import signal
import time

# Slurm's --signal or a preemption may come while torch and transformers are still being
# imported (seconds on a loaded node): remember it from here on, so that the start-up
# ends cleanly and the training loop stops at once, instead of dying half-way.
_EARLY_SIGNALS: list[int] = []
_START = time.time()  # --exit-duration-in-mins counts from here, as in Megatron
if __name__ == "__main__":
    for _sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(_sig, lambda signum, frame: _EARLY_SIGNALS.append(signum))

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from contextlib import nullcontext  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from datetime import datetime  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from hpcllm.bench.energy import EnergyCounter, job_energy  # noqa: E402
from hpcllm.models.planner import pad_vocab  # noqa: E402
from hpcllm.training.checkpoints import checksums  # noqa: E402
from hpcllm.training.checkpoints import tracker as checkpoints  # noqa: E402
from hpcllm.training.checkpoints.tracker import CheckpointError  # noqa: E402
from hpcllm.training.engines.compute_clock import ComputeClock  # noqa: E402
from hpcllm.training.engines.fault_injection import Fault, inject  # noqa: E402
from hpcllm.training.engines.heartbeat import Heartbeat  # noqa: E402
from hpcllm.training.engines.log_lines import save_timer_line  # noqa: E402
from hpcllm.training.plan.data import Blend, build_datasets, check_blend, sample_counts  # noqa: E402

log = logging.getLogger(__name__)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m hpcllm.training.engines.torch_engine",
        description="Train a small causal LM with PyTorch (Megatron-LM's flag names).",
        allow_abbrev=False,
    )
    a = p.add_argument
    a("--num-layers", type=int, required=True)
    a("--hidden-size", type=int, required=True)
    a("--ffn-hidden-size", type=int, default=None, help="default 4 x hidden size")
    a("--num-attention-heads", type=int, required=True)
    a("--seq-length", type=int, required=True)
    a("--max-position-embeddings", type=int, default=None)
    a("--position-embedding-type", choices=["rope", "learned_absolute"], default="rope")
    a("--make-vocab-size-divisible-by", type=int, default=128)
    a("--micro-batch-size", type=int, required=True)
    a("--global-batch-size", type=int, required=True)
    a("--train-iters", type=int, required=True, help="length of the whole run (LR schedule)")
    a("--exit-interval", type=int, default=None, help="stop at an iteration divisible by it")
    a("--exit-duration-in-mins", type=float, default=None)
    a("--exit-signal-handler", action="store_true", help="save and exit on SIGTERM/SIGUSR1/SIGUSR2")
    a("--bf16", action="store_true", help="bf16 autocast (weights and optimizer in fp32)")
    a(
        "--fp16",
        action="store_true",
        help="fp16 autocast with dynamic loss scaling (Megatron's --fp16 default)",
    )
    a("--adam-beta1", type=float, default=0.9)
    a("--adam-beta2", type=float, default=0.999)
    a("--adam-eps", type=float, default=1e-8)
    a("--weight-decay", type=float, default=0.01)
    a("--clip-grad", type=float, default=1.0)
    a("--lr", type=float, required=True)
    a("--min-lr", type=float, default=0.0)
    a("--lr-decay-style", choices=["cosine", "linear", "constant"], default="cosine")
    a("--lr-warmup-iters", type=int, default=0)
    a("--seed", type=int, default=1234)
    a("--hidden-dropout", type=float, default=0.0, help="dropout after attention and MLP")
    a("--attention-dropout", type=float, default=0.0, help="dropout of attention scores")
    a("--data-path", nargs="*", default=None, help="prefix, or weight prefix weight prefix ...")
    a("--mock-data", action="store_true", help="Megatron's mock data (benchmarks)")
    a("--split", default="969,30,1")
    a("--data-cache-path", default=None)
    a("--vocab-file", default=None, help="GPT-2 style vocab.json (gives size and EOD)")
    a(
        "--tokenizer-model",
        default=None,
        help="a folder with a Hugging Face tokenizer.json and tokenizer_config.json (any "
        "model: BPE, Unigram, WordPiece), as Megatron's HuggingFaceTokenizer reads it",
    )
    a("--merge-file", default=None, help="accepted for Megatron compatibility")
    a("--vocab-size", type=int, default=None, help="without --vocab-file (mock data)")
    a("--eod-token", default="<|endoftext|>")
    a("--save", default=None)
    a("--load", default=None)
    a("--save-interval", type=int, default=None)
    a("--log-interval", type=int, default=100)
    a("--log-throughput", action="store_true")
    a("--eval-interval", type=int, default=1000, help="evaluate every this many iterations")
    a("--eval-iters", type=int, default=100, help="validation batches per evaluation (0: none)")
    a("--tensorboard-dir", default=None, help="write TensorBoard scalars here (rank 0)")
    a("--device", choices=["auto", "cpu", "cuda"], default="auto")
    a("--threads", type=int, default=None, help="torch CPU threads per process")
    return p


# ---------------------------------------------------------------------------- the model


def build_model(args: argparse.Namespace, vocab_size: int) -> torch.nn.Module:
    """A Hugging Face causal LM with the experiment's sizes, initialised from ``--seed``."""
    import transformers

    transformers.logging.set_verbosity_error()
    ffn = args.ffn_hidden_size or 4 * args.hidden_size
    positions = args.max_position_embeddings or args.seq_length
    torch.manual_seed(args.seed)
    if args.position_embedding_type == "rope":
        cfg = transformers.LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=args.hidden_size,
            intermediate_size=ffn,
            num_hidden_layers=args.num_layers,
            num_attention_heads=args.num_attention_heads,
            num_key_value_heads=args.num_attention_heads,
            max_position_embeddings=positions,
            tie_word_embeddings=True,
            attention_dropout=args.attention_dropout,
        )
        model = transformers.LlamaForCausalLM(cfg)
        if args.hidden_dropout:  # Llama has none of its own: Megatron's, after each block
            _add_hidden_dropout(model, args.hidden_dropout)
    else:
        cfg = transformers.GPT2Config(
            vocab_size=vocab_size,
            n_embd=args.hidden_size,
            n_inner=ffn,
            n_layer=args.num_layers,
            n_head=args.num_attention_heads,
            n_positions=positions,
            resid_pdrop=args.hidden_dropout,
            embd_pdrop=args.hidden_dropout,
            attn_pdrop=args.attention_dropout,
        )
        model = transformers.GPT2LMHeadModel(cfg)
    model.config._attn_implementation = "sdpa"  # PyTorch SDPA: flash attention on GPUs
    return model


def _add_hidden_dropout(model, p: float) -> None:
    """Dropout on the output of each attention and MLP block (Megatron's hidden dropout,
    applied before the residual add)."""
    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(_dropout_hook(p))
        layer.mlp.register_forward_hook(_dropout_hook(p))


def _dropout_hook(p: float):
    def hook(module, inputs, output):
        if isinstance(output, tuple):
            return (torch.nn.functional.dropout(output[0], p, module.training), *output[1:])
        return torch.nn.functional.dropout(output, p, module.training)

    return hook


def flops_per_iteration(args: argparse.Namespace, vocab_size: int) -> float:
    """Megatron-LM's ``num_floating_point_operations`` for a dense transformer.

    Forward and backward (3x forward), attention with the ``s/h`` score term, the gated
    (SwiGLU) MLP of Llama counted 3/2, the logits.
    """
    h, s, layers = args.hidden_size, args.seq_length, args.num_layers
    ffn = args.ffn_hidden_size or 4 * h
    gated = 1.5 if args.position_embedding_type == "rope" else 1.0
    per_token_layer = 12 * h * h * ((1 + 1 + s / h) + (ffn / h) * gated)
    logits = 6 * h * vocab_size
    return args.global_batch_size * s * (layers * per_token_layer + logits)


# ------------------------------------------------------------- learning-rate schedule


def learning_rate(args: argparse.Namespace, step: int) -> float:
    """Megatron's ``OptimizerParamScheduler.get_lr`` after ``step`` optimizer steps."""
    warmup, decay = args.lr_warmup_iters, args.train_iters
    if warmup > 0 and step <= warmup:
        return args.lr * step / warmup
    if args.lr_decay_style == "constant" or step > decay:
        return args.lr if args.lr_decay_style == "constant" else args.min_lr
    ratio = (step - warmup) / max(1, decay - warmup)
    if args.lr_decay_style == "linear":
        coeff = 1.0 - ratio
    else:
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    return args.min_lr + coeff * (args.lr - args.min_lr)


# ------------------------------------------------------------------- distributed set-up


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device


def init_distributed(device_choice: str) -> Dist:
    """A process group under torchrun (env://), or a one-process group without it.

    Megatron Core's dataset builder expects a process group when it caches indices.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device_choice == "cuda" or (device_choice == "auto" and torch.cuda.is_available())
    device = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if cuda else "gloo"
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, rank=rank, world_size=world)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return Dist(rank, world, local, device)


def seed_everything(seed: int) -> None:
    """Every generator the run may draw from, seeded (Megatron's ``_set_random_seed``):
    unseeded, Python's and NumPy's would start from the OS's entropy, and a run and its
    resumed twin would differ in whatever draws from them."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # the CPU generator and every device's


class StopFlag:
    """Set by SIGTERM/SIGUSR1/SIGUSR2; the loop finishes the iteration, saves and exits."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def install(self) -> None:
        if _EARLY_SIGNALS:  # came during the imports
            self.signal = _EARLY_SIGNALS[-1]
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signal = signum


# ------------------------------------------------------------------------- checkpoints


def _rng_state() -> dict:
    import random

    import numpy as np

    state = {
        "random": random.getstate(),
        "np": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    import random

    import numpy as np

    random.setstate(state["random"])
    np.random.set_state(state["np"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_checkpoint(
    save: str,
    iteration: int,
    model,
    optimizer,
    scheduler: dict,
    args,
    d: Dist,
    beat: Heartbeat | None = None,
    fault: Fault | None = None,
) -> None:
    """Rank 0 writes ``iter_*/mp_rank_00/model_optim_rng.pt``, then commits the tracker;
    then it prints how long that took as Megatron-LM prints its save timer (the segment
    sizes Slurm's signal lead from it: hpcllm.training.campaign.signal_lead)."""
    started = time.time()
    rng = [None] * d.world
    dist.all_gather_object(rng, _rng_state())
    inject(fault, "save", d.rank, iteration)  # e.g. a write stuck on the file system
    if d.rank == 0:
        tmp = checkpoints.begin_iteration_dir(save, iteration)
        state = {
            "checkpoint_version": 3.0,
            "iteration": iteration,
            "consumed_samples": iteration * args.global_batch_size,
            "args": vars(args),
            "model": _unwrap(model).state_dict(),
            "optimizer": optimizer.state_dict(),
            "opt_param_scheduler": scheduler,
            "rng_state": rng,
        }
        (tmp / "mp_rank_00").mkdir()
        torch.save(state, tmp / "mp_rank_00" / "model_optim_rng.pt")
        try:
            checksums.write_manifest(tmp)  # committed with the files it describes
        except ImportError as e:  # an image without xxhash: the segment records them
            print(f"warning: no checksums written with the checkpoint ({e})", flush=True)
        checkpoints.finish_iteration_dir(save, iteration)
        print(
            f"  successfully saved checkpoint from iteration {iteration:7d} to {save}",
            flush=True,
        )
    if beat is not None:  # past the write: a rank stuck in it is behind the others
        beat.progress("save", iteration, doing="barrier")
    dist.barrier()
    if d.rank == 0:
        print(save_timer_line((time.time() - started) * 1000), flush=True)


def load_checkpoint(load: str, model, optimizer, args, d: Dist) -> int:
    """Restore the newest complete checkpoint; 0 when there is none."""
    iteration = checkpoints.latest_iteration(load)
    if iteration is None:
        return 0
    path = checkpoints.model_file(load, iteration)
    if not path.is_file():
        raise CheckpointError(
            f"{path}: missing, although {Path(load) / checkpoints.TRACKER} names iteration "
            f"{iteration}. The checkpoint is partial; point the tracker at a complete one "
            f"or delete {load} to start afresh."
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
        for key in ("model", "optimizer", "rng_state"):
            state[key]  # noqa: B018 (a partial state is as unusable as a corrupt file)
    except Exception as e:  # torch raises RuntimeError, EOFError, UnpicklingError, ...
        raise CheckpointError(
            f"{path}: cannot be loaded, the file is corrupt or incomplete "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'}). "
            f"Point {Path(load) / checkpoints.TRACKER} at an older complete iteration, or "
            f"delete {load} to start afresh."
        ) from None
    saved = state.get("args", {})
    for key in ("num_layers", "hidden_size", "num_attention_heads", "global_batch_size"):
        if key in saved and saved[key] != getattr(args, key):
            raise CheckpointError(
                f"{path}: was trained with {key}={saved[key]}, this run has "
                f"{getattr(args, key)}; resume with the same settings or use another --save"
            )
    _unwrap(model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    rng = state["rng_state"]
    _set_rng_state(rng[d.rank] if len(rng) == d.world else rng[0])
    if d.rank == 0:
        print(f"  loaded checkpoint from {load} at iteration {iteration}", flush=True)
    return iteration


def _unwrap(model):
    return model.module if hasattr(model, "module") else model


# ---------------------------------------------------------------------------- training


def vocabulary(args) -> tuple[int, int]:
    """(vocabulary size, end-of-document id) from ``--tokenizer-model``, ``--vocab-file``
    or ``--vocab-size``."""
    if getattr(args, "tokenizer_model", None) or args.vocab_file:
        from hpcllm.text.tokenizers_config import engine_vocabulary

        if getattr(args, "tokenizer_model", None):
            folder = Path(args.tokenizer_model)
            files = (str(folder / "tokenizer.json"), str(folder / "tokenizer_config.json"))
        else:
            files = (args.vocab_file, args.merge_file or "")
        return engine_vocabulary(files, args.eod_token)
    if not args.vocab_size:
        raise ValueError("give --vocab-file (with real data) or --vocab-size (mock data)")
    return args.vocab_size, args.vocab_size - 1


def blend_from(data_path: list[str]) -> Blend:
    """Megatron's ``--data-path``: ``prefix ...`` or ``weight prefix weight prefix ...``."""
    try:
        float(data_path[0])
    except ValueError:
        return Blend(tuple(data_path), None)
    if len(data_path) % 2:
        raise ValueError(f"--data-path {' '.join(data_path)}: weights and prefixes must pair")
    return Blend(tuple(data_path[1::2]), tuple(float(w) for w in data_path[0::2]))


def log_line(
    iteration,
    args,
    consumed,
    elapsed_ms,
    tflops,
    lr,
    loss,
    grad_norm,
    throughput: bool,
    loss_scale: float = 1.0,
    skipped: int = 0,
    energy_j_per_gpu: float | None = None,
) -> str:
    """One line in the format of Megatron-LM's ``training_log`` (megatron/training/training.py;
    the pinned commit prints the time without microseconds)."""
    s = f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S')}]"
    s += f" iteration {iteration:8d}/{args.train_iters:8d} |"
    s += f" consumed samples: {consumed:12d} |"
    s += f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
    if throughput:
        # Megatron's one decimal; a laptop's CPU "GPU" does well under 0.1: its digits
        digits = 1 if tflops >= 1 else 6
        s += f" throughput per GPU (TFLOP/s/GPU): {tflops:.{digits}f} |"
    if energy_j_per_gpu is not None:
        s += f" energy per GPU (J/iter/GPU): {energy_j_per_gpu:.1f} |"
        s += f" power per GPU (W/GPU): {energy_j_per_gpu / (elapsed_ms / 1000):.1f} |"
    s += f" learning rate: {lr:.6E} |"
    s += f" global batch size: {args.global_batch_size:5d} |"
    s += f" lm loss: {loss:.6E} |"
    s += f" loss scale: {loss_scale:.1f} |"
    s += f" grad norm: {grad_norm:.3f} |"
    s += f" number of skipped iterations: {skipped:3d} |"
    s += " number of nan iterations:   0 |"
    return s


def validation_line(iteration: int, loss: float) -> str:
    """Megatron-LM's ``evaluate_and_print_results`` output, dashes included."""
    text = (
        f" validation loss at iteration {iteration} | lm loss value: {loss:.6E} | "
        f"lm loss PPL: {math.exp(min(20.0, loss)):.6E} | "
    )
    rule = "-" * (len(text) + 1)
    return f"{rule}\n{text}\n{rule}"


@torch.no_grad()
def evaluate(
    model, valid_ds, iteration: int, args, d: Dist, autocast, micro_steps: int, beat=None
) -> float:
    """Mean loss over ``--eval-iters`` global batches of the validation split.

    Like Megatron, each evaluation takes the next batches (evaluation k reads batches
    (k-1) x eval_iters ...), so that a resumed run evaluates on the same samples.
    """
    model.eval()
    dp_chunk = args.micro_batch_size * d.world
    first = (math.ceil(iteration / args.eval_interval) - 1) * args.eval_iters
    total = torch.zeros(2, device=d.device, dtype=torch.float64)
    for batch in range(first, first + args.eval_iters):
        if beat is not None:
            beat.progress("eval", iteration, batch=batch)
        for m in range(micro_steps):
            start = (
                batch * args.global_batch_size + m * dp_chunk + d.rank * args.micro_batch_size
            ) % len(valid_ds)
            samples = [valid_ds[(start + i) % len(valid_ds)] for i in range(args.micro_batch_size)]
            tokens = torch.stack([s["tokens"] for s in samples]).to(d.device)
            labels = torch.stack([s["labels"] for s in samples]).to(d.device)
            mask = torch.stack([s["loss_mask"] for s in samples]).to(d.device)
            with autocast:
                logits = _unwrap(model)(input_ids=tokens).logits
            losses = torch.nn.functional.cross_entropy(
                logits.float().view(-1, logits.size(-1)), labels.view(-1), reduction="none"
            )
            total[0] += (losses * mask.view(-1)).sum() / mask.sum()
            total[1] += 1
    if d.world > 1:
        dist.all_reduce(total)
    model.train()
    return float(total[0] / total[1])


class Board:
    """TensorBoard scalars (Megatron's tag names) from rank 0; nothing without a folder."""

    def __init__(self, folder: str | None):
        self.writer = None
        if folder:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:  # the tensorboard package is a dependency of hpcllm
                print(f"warning: no TensorBoard scalars ({e}); pip install tensorboard", flush=True)
                return
            self.writer = SummaryWriter(folder)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self.writer is not None:
            for tag, value in values.items():
                self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _show_dataset_index_log() -> None:
    """Megatron Core's dataset messages ("Load the ... indices" or "Build and save ...")
    in the engine's log: the segment log then shows whether an index was built."""
    logger = logging.getLogger("megatron.core.datasets")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def train(args: argparse.Namespace) -> dict:
    """Train until ``--exit-interval``/``--train-iters``, a time limit or a signal.

    Returns a summary (rank 0's view): first and last iteration, consumed samples, the
    last logged loss, seconds, whether it stopped early and why.
    """
    if args.threads:
        torch.set_num_threads(args.threads)
    # This rank's heartbeat for the segment's watchdog (where the segment asks for one):
    # a phase change at every step, around data loading, evaluation and saves.
    beat = Heartbeat.from_environment(int(os.environ.get("RANK", "0"))).start()
    fault = Fault.from_environment()  # None outside the watchdog's tests
    stop_flag = StopFlag()
    if args.exit_signal_handler:
        stop_flag.install()
    else:
        if __name__ == "__main__":
            # The start-up's handlers only remember signals: without --exit-signal-handler
            # SIGTERM and SIGUSR1/2 end the process, as they end Megatron's.
            for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
                signal.signal(sig, signal.SIG_DFL)
        if _EARLY_SIGNALS:  # one came during the imports: end as it would have ended us
            raise SystemExit(128 + _EARLY_SIGNALS[-1])
    seed_everything(args.seed)
    _show_dataset_index_log()
    d = init_distributed(args.device)
    beat.progress("start", 0, doing="datasets")  # the start-up's steps count as progress
    tokenizer_vocab, eod = vocabulary(args)
    padded = pad_vocab(tokenizer_vocab, 1, args.make_vocab_size_divisible_by)
    dp_chunk = args.micro_batch_size * d.world
    if args.global_batch_size % dp_chunk:
        raise ValueError(
            f"--global-batch-size {args.global_batch_size} is not divisible by micro batch "
            f"x data-parallel size = {dp_chunk}"
        )
    micro_steps = args.global_batch_size // dp_chunk
    stop_at = args.train_iters
    if args.exit_interval:
        stop_at = min(stop_at, args.exit_interval)

    if args.mock_data:
        blend = None
    else:
        if not args.data_path:
            raise ValueError("give --data-path (or --mock-data)")
        blend = blend_from(args.data_path)
        check_blend(blend, tokenizer_vocab)
    eval_iters = args.eval_iters if blend is not None else 0
    train_ds, valid_ds, _ = build_datasets(
        blend,
        args.split,
        args.seq_length,
        args.seed,
        sample_counts(args.train_iters, args.global_batch_size, args.eval_interval, eval_iters),
        tokenizer_vocab,
        eod,
        args.data_cache_path,
    )
    if eval_iters and valid_ds is None:
        raise ValueError(
            f"--eval-iters {eval_iters}: split {args.split!r} gives the validation split no "
            "share; give it one or set --eval-iters 0"
        )

    beat.progress("start", 0, doing="model")
    model = build_model(args, padded).to(d.device)
    # this rank's compute time per iteration, for the straggler check: its heartbeat
    synchronize = torch.cuda.synchronize if d.device.type == "cuda" else None
    clock = ComputeClock(model, synchronize=synchronize)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_eps,
    )
    iteration = 0
    if args.load:
        beat.progress("start", 0, doing="load")
        iteration = load_checkpoint(args.load, model, optimizer, args, d)
    if d.world > 1:
        ids = [d.local_rank] if d.device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    model.train()
    if args.bf16 and args.fp16:
        raise SystemExit("torch engine: --bf16 and --fp16 exclude each other")
    half = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None
    autocast = torch.autocast(d.device.type, dtype=half) if half else nullcontext()
    # fp16: the loss is scaled up before backward and the gradients down before clipping;
    # steps with inf/nan gradients are skipped and the scale lowered (dynamic loss scaling,
    # as Megatron's --fp16 without --loss-scale). A no-op otherwise.
    scaler = torch.amp.GradScaler(d.device.type, enabled=args.fp16)
    flops = flops_per_iteration(args, padded)
    # The GPUs' energy per log interval where they have a counter (Megatron's --log-energy).
    energy = EnergyCounter(d.device.index or 0) if d.device.type == "cuda" else None
    interval_joules = energy.joules() if energy else None
    first = iteration + 1
    summary = {"first_iteration": first, "last_iteration": iteration, "loss": None}
    if d.rank == 0:
        print(
            f"torch engine: world size {d.world}, device {d.device}, "
            f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
            f"iterations {first}..{stop_at} of {args.train_iters}",
            flush=True,
        )
    interval_loss, interval_iters, interval_start = 0.0, 0, time.time()
    interval_skipped = 0
    board = Board(args.tensorboard_dir) if d.rank == 0 else Board(None)
    stopped = "signal" if stop_flag.signal is not None else None
    if stopped and d.rank == 0:  # during the start-up: train nothing, save nothing
        print(f"exiting at iteration {iteration} (signal) before {stop_at}", flush=True)
    while iteration < stop_at and not stopped:
        lr = learning_rate(args, iteration)
        for group in optimizer.param_groups:
            group["lr"] = lr
        base = iteration * args.global_batch_size
        loss_sum = torch.zeros(1, device=d.device)
        clock.seconds = 0.0  # an evaluation or a save before it is not this step's compute
        for m in range(micro_steps):
            beat.progress("data", iteration + 1, micro=m)
            inject(fault, "data", d.rank, iteration + 1)
            with clock.timed():
                start = base + m * dp_chunk + d.rank * args.micro_batch_size
                samples = [train_ds[i] for i in range(start, start + args.micro_batch_size)]
            beat.progress("step", iteration + 1, micro=m)
            with clock.timed():
                tokens = torch.stack([s["tokens"] for s in samples]).to(d.device)
                labels = torch.stack([s["labels"] for s in samples]).to(d.device)
                mask = torch.stack([s["loss_mask"] for s in samples]).to(d.device)
            sync = m == micro_steps - 1 or d.world == 1
            with model.no_sync() if not sync else nullcontext(), autocast:
                logits = model(input_ids=tokens).logits  # the clock's hooks time it
            with clock.timed():
                losses = torch.nn.functional.cross_entropy(
                    logits.float().view(-1, logits.size(-1)), labels.view(-1), reduction="none"
                )
                loss = (losses * mask.view(-1)).sum() / mask.sum()
                inject(fault, "slow", d.rank, iteration + 1)  # a straggler, in its compute
            # the synchronising backward carries DDP's gradient all-reduce: not timed
            timed = clock.timed() if not sync or d.world == 1 else nullcontext()
            with model.no_sync() if not sync else nullcontext(), timed:
                scaler.scale(loss / micro_steps).backward()
            loss_sum += loss.detach()
        with clock.timed():
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
            scale = scaler.get_scale() if args.fp16 else 1.0
            scaler.step(optimizer)
            scaler.update()
            if args.fp16 and scaler.get_scale() < scale:  # inf/nan gradients: step skipped
                interval_skipped += 1
            optimizer.zero_grad(set_to_none=True)
        beat.compute(clock.end_iteration())
        iteration += 1
        # One all-reduce carries the loss and whether any rank must stop.
        wants_stop = stop_flag.signal is not None or (
            args.exit_duration_in_mins is not None
            and (time.time() - _START) / 60 > args.exit_duration_in_mins
        )
        stats = torch.tensor(
            [loss_sum.item() / micro_steps, float(stop_flag.signal is not None), float(wants_stop)],
            device=d.device,
            dtype=torch.float64,
        )
        beat.progress("sync", iteration)
        if d.world > 1:
            mean = stats[:1].clone()
            dist.all_reduce(mean)
            dist.all_reduce(stats, op=dist.ReduceOp.MAX)
            stats[0] = mean[0] / d.world
        interval_loss += stats[0].item()
        interval_iters += 1
        if iteration % args.log_interval == 0 or iteration == stop_at or stats[2]:
            elapsed = (time.time() - interval_start) / interval_iters
            per_gpu = None
            if energy is not None:  # every rank: job_energy sums over them
                now_joules = energy.joules()
                spent = job_energy(None if now_joules is None else now_joules - interval_joules)
                interval_joules = now_joules
                per_gpu = None if spent is None else spent / d.world / interval_iters
            if d.rank == 0:
                tflops = flops / (elapsed * 1e12 * d.world)
                line = log_line(
                    iteration,
                    args,
                    iteration * args.global_batch_size,
                    elapsed * 1000,
                    tflops,
                    learning_rate(args, iteration),
                    interval_loss / interval_iters,
                    float(grad_norm),
                    args.log_throughput,
                    loss_scale=scaler.get_scale() if args.fp16 else 1.0,
                    skipped=interval_skipped,
                    energy_j_per_gpu=per_gpu,
                )
                print(line, flush=True)
                tokens = iteration * args.global_batch_size * args.seq_length
                board.scalars(
                    iteration,
                    {
                        "lm loss": interval_loss / interval_iters,
                        "learning-rate": learning_rate(args, iteration),
                        "grad-norm": float(grad_norm),
                        "throughput": tflops,
                        "tokens-per-second": args.global_batch_size * args.seq_length / elapsed,
                        "consumed-tokens": tokens,
                    },
                )
            summary["loss"] = interval_loss / interval_iters
            interval_loss, interval_iters, interval_start = 0.0, 0, time.time()
            interval_skipped = 0
        if stats[2]:
            stopped = "signal" if stats[1] else "time"
        if eval_iters and (iteration % args.eval_interval == 0 or iteration == args.train_iters):
            valid = evaluate(model, valid_ds, iteration, args, d, autocast, micro_steps, beat)
            if d.rank == 0:
                print(validation_line(iteration, valid), flush=True)
                board.scalars(iteration, {"lm loss validation": valid})
            summary["valid_loss"] = valid
        scheduler = {
            "max_lr": args.lr,
            "min_lr": args.min_lr,
            "lr_warmup_steps": args.lr_warmup_iters,
            "lr_decay_steps": args.train_iters,
            "lr_decay_style": args.lr_decay_style,
            "num_steps": iteration,
        }
        at_interval = args.save_interval and iteration % args.save_interval == 0
        if args.save and (at_interval or stopped or iteration == stop_at):
            beat.progress("save", iteration)
            save_checkpoint(args.save, iteration, model, optimizer, scheduler, args, d, beat, fault)
        if stopped:
            if d.rank == 0:
                print(f"exiting at iteration {iteration} ({stopped}) before {stop_at}", flush=True)
            break
    board.close()
    summary.update(
        last_iteration=iteration,
        consumed_samples=iteration * args.global_batch_size,
        seconds=time.time() - _START,
        complete=iteration >= stop_at,
        stopped=stopped,
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = parser().parse_args(argv)
    summary = train(args)
    if dist.is_initialized():
        dist.barrier()  # no rank tears the group down while another still uses it
        dist.destroy_process_group()
    print(f"torch engine done: {json.dumps(summary)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
