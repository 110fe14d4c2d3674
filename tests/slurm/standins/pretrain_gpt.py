"""A stand-in for Megatron-LM's pretrain_gpt.py in the cluster rehearsal's image.

Megatron-LM's GPU code cannot run here. This program sits where the image has it
(/opt/Megatron-LM/pretrain_gpt.py, see the apptainer stand-in) and does what a start-up
of the pinned commit checks and what the workflow reads back, nothing more:

- every option must be one of the pinned commit's (megatron_flags.txt beside it, the
  option strings of its megatron/training/arguments.py), else argparse's error, exit 2;
- the checks of that commit's ``validate_args`` and start-up that apply without a GPU:
  world size divisible by TP x PP, global batch by micro batch x DP, sequence length
  within the position embeddings, ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with TP (GPUs before
  Blackwell), the tokenizer's files (HuggingFaceTokenizer's folder, NullTokenizer's
  vocabulary size; GPT2BPETokenizer fails as offline, asking the hub for gpt2),
  the data prefixes' .bin/.idx (the .idx magic), warm-up shorter than the decay;
- the ranks meet in a gloo process group (torchrun's rendezvous across the nodes) and
  each prints its node; the last rank prints Megatron's per-iteration log line;
- ``--load``/``--save``/``--save-interval``/``--exit-interval``/``--exit-signal-handler``/
  ``--exit-signal`` (a ``signal.Signals`` name, SIGTERM by default, as at the pin; only that
  one is caught)/``--exit-duration-in-mins``: resumes from and writes checkpoints in Megatron's layout
  (``iter_0000004/mp_rank_00[_000]/model_optim_rng.pt``, the tracker file last), each
  with its rank's weights of the model's names and shapes in the legacy layout (a fixed
  draw, not trained), so that the export and the evaluation after it have a model;
  after each save rank 0 prints Megatron's ``save-checkpoint`` timer line. A save on the
  exit signal first sleeps ``$HPCLLM_REHEARSAL_SIGNAL_SAVE_SECONDS`` (a large model's
  save, longer than torchrun's 30 s shutdown timeout), where the rehearsal sets it.
"""

import os
import signal
import socket
import sys
import time
from datetime import datetime
from pathlib import Path

FLAGS_FILE = Path(__file__).with_name("megatron_flags.txt")
_START = time.time()


def die(message: str, code: int = 1) -> None:
    print(f"pretrain_gpt.py: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def known_flags() -> set[str]:
    lines = FLAGS_FILE.read_text().splitlines()
    return {line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()}


def parse(argv: list[str]) -> dict[str, list[str]]:
    """``--flag value...`` into {flag: [values]}; unknown flags as argparse reports them."""
    known = known_flags()
    options: dict[str, list[str]] = {}
    unknown: list[str] = []
    current = None
    for word in argv:
        if word.startswith("--"):
            if word not in known:
                unknown.append(word)
            current = options.setdefault(word, [])
        elif current is None:
            unknown.append(word)
        else:
            current.append(word)
    if unknown:
        die(f"unrecognized arguments: {' '.join(unknown)}", 2)
    return options


def main() -> int:
    opts = parse(sys.argv[1:])

    def value(flag, default=None, kind=str):
        values = opts.get(flag)
        return kind(values[0]) if values else default

    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    tp = value("--tensor-model-parallel-size", 1, int)
    pp = value("--pipeline-model-parallel-size", 1, int)
    if world % (tp * pp):
        die(f"world size {world} is not divisible by TP {tp} x PP {pp}")
    dp = world // (tp * pp)
    micro = value("--micro-batch-size", 1, int)
    global_batch = value("--global-batch-size", micro * dp, int)
    if global_batch % (micro * dp):
        die(f"global batch size {global_batch} is not divisible by micro {micro} x DP {dp}")
    seq = value("--seq-length", None, int)
    if seq is None or seq > value("--max-position-embeddings", seq, int):
        die("--seq-length is missing or longer than --max-position-embeddings")
    # validate_args at the pin, on GPUs before Blackwell (the rehearsal's are A100s).
    if tp > 1 and os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
        die(
            "AssertionError: Using tensor model parallelism or context parallelism require "
            "setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1"
        )
    if value("--tokenizer-type") == "NullTokenizer" and value("--vocab-size") is None:
        die("NullTokenizer needs --vocab-size")
    if value("--tokenizer-type") == "HuggingFaceTokenizer":  # read offline from a folder
        model = value("--tokenizer-model")
        if model is None or not os.path.isfile(os.path.join(model, "tokenizer.json")):
            die(
                f"HuggingFaceTokenizer needs --tokenizer-model, a folder with tokenizer.json (got {model})"
            )
    if value("--tokenizer-type") == "GPT2BPETokenizer":
        # at the pin: AutoTokenizer.from_pretrained("gpt2", ...), from the hub, which
        # compute nodes cannot reach (the workflow never generates it)
        die(
            "ValueError: Unable to instantiate HuggingFace AutoTokenizer for gpt2. Exception: "
            "We couldn't connect to 'https://huggingface.co' to load the files"
        )
    if "--mock-data" not in opts:
        paths = opts.get("--data-path") or die("--data-path is required without --mock-data")
        for prefix in paths[1::2] if len(paths) > 1 else paths:
            with open(prefix + ".idx", "rb") as f:
                if f.read(9) != b"MMIDIDX\x00\x00":
                    die(f"{prefix}.idx is not a Megatron index file")
            if not os.path.isfile(prefix + ".bin"):
                die(f"{prefix}.bin does not exist")
    train_iters = value("--train-iters", None, int) or die("--train-iters is required")
    if value("--lr-warmup-iters", 0, int) >= train_iters:
        die("AssertionError: lr_warmup_steps must be less than lr_decay_steps (--train-iters)")

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    print(
        f"> rank {rank} of {world} on node {node} (host {socket.gethostname()}, local rank "
        f"{os.environ.get('LOCAL_RANK')}, CUDA_VISIBLE_DEVICES "
        f"{os.environ.get('CUDA_VISIBLE_DEVICES')})",
        flush=True,
    )
    check = torch.ones(1)
    dist.all_reduce(check)
    if int(check.item()) != world:
        die(f"the process group has {int(check.item())} ranks, WORLD_SIZE says {world}")

    save, load = value("--save"), value("--load")
    iteration = 0
    tracker = "latest_checkpointed_iteration.txt"
    if load and os.path.isfile(os.path.join(load, tracker)):
        iteration = int(Path(load, tracker).read_text())
        if not Path(load, f"iter_{iteration:07d}").is_dir():
            die(f"{load}: the tracker names iteration {iteration}, which is missing")
        if rank == 0:
            print(f" loading checkpoint from {load} at iteration {iteration}", flush=True)
    stop = min(train_iters, value("--exit-interval", train_iters, int))
    minutes = value("--exit-duration-in-mins", None, float)
    stopped = []
    if "--exit-signal-handler" in opts:
        exit_signal = signal.Signals[value("--exit-signal", "SIGTERM")]  # KeyError as at the pin
        signal.signal(exit_signal, lambda *_: stopped.append("signal"))

    layers, hidden = value("--num-layers", 1, int), value("--hidden-size", 1, int)

    def model_shard(tp_rank: int, pp_rank: int) -> dict:
        """This rank's weights of Megatron's GPT model (local layers, tied embeddings) in
        the legacy layout: the export's merge reads them as Megatron's. Not trained
        (the stand-in runs no model): a fixed draw of the right names and shapes."""
        heads = value("--num-attention-heads", 1, int)
        ffn = value("--ffn-hidden-size", 4 * hidden, int)
        gen = torch.Generator().manual_seed(1000 * pp_rank + tp_rank)

        def draw(*shape):
            return torch.randn(*shape, generator=gen) * 0.02

        if hidden % heads or hidden % tp or ffn % tp:
            die(f"hidden {hidden} / heads {heads} / FFN {ffn} do not split over TP {tp}")
        state = {}
        if pp_rank == 0:
            state["embedding.word_embeddings.weight"] = draw(padded_vocab() // tp, hidden)
            if value("--position-embedding-type", "learned_absolute") == "learned_absolute":
                positions = value("--max-position-embeddings", seq, int)
                state["embedding.position_embeddings.weight"] = (
                    torch.randn(positions, hidden, generator=torch.Generator().manual_seed(7))
                    * 0.02
                )  # replicated over TP: the same draw on every rank
        for i in range(layers // pp):
            p = f"decoder.layers.{i}."
            for norm in ("input_layernorm", "pre_mlp_layernorm"):
                state[p + f"{norm}.weight"] = torch.ones(hidden)
                state[p + f"{norm}.bias"] = torch.zeros(hidden)
            state[p + "self_attention.linear_qkv.weight"] = draw(3 * hidden // tp, hidden)
            state[p + "self_attention.linear_qkv.bias"] = torch.zeros(3 * hidden // tp)
            state[p + "self_attention.linear_proj.weight"] = draw(hidden, hidden // tp)
            state[p + "self_attention.linear_proj.bias"] = torch.zeros(hidden)
            state[p + "mlp.linear_fc1.weight"] = draw(ffn // tp, hidden)
            state[p + "mlp.linear_fc1.bias"] = torch.zeros(ffn // tp)
            state[p + "mlp.linear_fc2.weight"] = draw(hidden, ffn // tp)
            state[p + "mlp.linear_fc2.bias"] = torch.zeros(hidden)
        if pp_rank == pp - 1:
            state["decoder.final_layernorm.weight"] = torch.ones(hidden)
            state["decoder.final_layernorm.bias"] = torch.zeros(hidden)
        return state

    def padded_vocab() -> int:
        """The tokenizer's vocabulary padded as Megatron pads it (a multiple of
        --make-vocab-size-divisible-by x TP)."""
        kind = value("--tokenizer-type")
        if kind == "HuggingFaceTokenizer":
            from tokenizers import Tokenizer

            path = os.path.join(value("--tokenizer-model"), "tokenizer.json")
            vocab = Tokenizer.from_file(path).get_vocab_size()
        else:
            vocab = value("--vocab-size", 1, int)
        multiple = value("--make-vocab-size-divisible-by", 128, int) * tp
        return -(-vocab // multiple) * multiple

    def save_checkpoint(it: int) -> None:
        if not save:
            return
        started = time.time()
        if stopped:
            time.sleep(float(os.environ.get("HPCLLM_REHEARSAL_SIGNAL_SAVE_SECONDS") or 0))
        if rank == 0:
            print(f"saving checkpoint at iteration {it:7d} to {save}", flush=True)
        tp_rank, pp_rank = rank % tp, rank // (tp * dp)
        if (rank // tp) % dp == 0:  # data-parallel rank 0 of each (TP, PP) shard writes
            shard = f"mp_rank_{tp_rank:02d}" + (f"_{pp_rank:03d}" if pp > 1 else "")
            folder = Path(save, f"iter_{it:07d}", shard)
            folder.mkdir(parents=True, exist_ok=True)
            state = {"iteration": it, "checkpoint_version": 3.0, "args": opts}
            state["model"] = model_shard(tp_rank, pp_rank)
            torch.save(state, folder / "model_optim_rng.pt")
        dist.barrier()
        if rank == 0:
            Path(save, tracker + ".tmp").write_text(str(it))
            os.replace(Path(save, tracker + ".tmp"), Path(save, tracker))
            print(f"  successfully saved checkpoint from iteration {it:7d} to {save}", flush=True)
        if rank == world - 1:  # Megatron's timers log on the last rank
            ms = (time.time() - started) * 1000
            print(f"(min, max) time across ranks (ms):\n    {'save-checkpoint '.ljust(48, '.')}: "
                  f"({ms:.2f}, {ms:.2f})", flush=True)  # fmt: skip

    interval = value("--save-interval", None, int)
    flops = 72 * global_batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden))
    last = time.time()
    while iteration < stop:
        time.sleep(0.05)  # the "work" of one iteration
        iteration += 1
        flag = torch.tensor([1.0 if stopped else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        elapsed, last = time.time() - last, time.time()
        if rank == world - 1:  # Megatron logs on the last rank
            print(
                f" [{datetime.now():%Y-%m-%d %H:%M:%S}] iteration {iteration:8d}/{train_iters:8d} "
                f"| consumed samples: {iteration * global_batch:12d} | elapsed time per "
                f"iteration (ms): {elapsed * 1000:.1f} | throughput per GPU (TFLOP/s/GPU): "
                f"{flops / elapsed / world / 1e12:.1f} | learning rate: {1e-4:.6E} | global "
                f"batch size: {global_batch:5d} | lm loss: {10.5 / iteration:.6E} | loss "
                f"scale: 1.0 | grad norm: 1.000 | number of skipped iterations:   0 | number "
                f"of nan iterations:   0 |",
                flush=True,
            )
        out_of_time = minutes is not None and (time.time() - _START) / 60 > minutes
        if (
            flag.item()
            or out_of_time
            or (interval and iteration % interval == 0)
            or iteration == stop
        ):
            save_checkpoint(iteration)
        if flag.item() or out_of_time:
            if rank == 0:
                why = "receiving SIGTERM" if flag.item() else f"{minutes} minutes"
                print(f"exiting program after {why}.", flush=True)
            break
    if iteration == stop and stop < train_iters and rank == 0:
        print(f"exiting program at iteration {iteration}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
