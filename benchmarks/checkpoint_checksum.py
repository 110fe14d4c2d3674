"""What the checkpoint checksums cost against the save they protect.

Writes a torch engine checkpoint (``torch.save`` of model weights and AdamW's two
moment tensors, as ``save_checkpoint`` writes it) into a temporary ``iter_*`` folder,
then hashes the folder as the engine does before its commit
(``hpcllm.training.checkpoints.checksums.write_manifest``, XXH3-128) and verifies it as a resume
does (``checksums.problem``). Prints the medians over the rounds: seconds, MB/s and the
hashing time as a share of the save. ``--compare`` adds hashlib's SHA-256 and BLAKE2b
on the same file, for the choice of hash.

    python benchmarks/checkpoint_checksum.py                 # 100M parameters: 1.2 GB
    python benchmarks/checkpoint_checksum.py --params-m 350 --dir /scratch/me

The file is read back from the page cache, as it is right after a save; a verify before a
resume may read it from the file system (Lustre, GPFS), whose read rate then bounds it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hpcllm.training.checkpoints import checksums
from hpcllm.training.checkpoints import tracker as checkpoints


def state_dict(params_m: float, tensor_m: float = 4.0) -> dict:
    """Model weights and AdamW state of ``params_m`` million fp32 parameters."""
    total, size = int(params_m * 1e6), int(tensor_m * 1e6)
    shapes = [min(size, total - start) for start in range(0, total, size)]
    model = {f"layer{i}.weight": torch.randn(n) for i, n in enumerate(shapes)}
    state = {
        i: {"step": torch.tensor(10.0), "exp_avg": torch.randn(n), "exp_avg_sq": torch.rand(n)}
        for i, n in enumerate(shapes)
    }
    return {
        "iteration": 10,
        "model": model,
        "optimizer": {"state": state, "param_groups": [{"params": list(state)}]},
    }


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def hashlib_rate(path: Path, name: str) -> float:
    def run() -> None:
        h = hashlib.new(name)
        with open(path, "rb") as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)

    return path.stat().st_size / 1e6 / timed(run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--params-m", type=float, default=100.0, help="millions of parameters")
    p.add_argument("--rounds", type=int, default=3, help="saves measured (medians printed)")
    p.add_argument("--dir", default=None, help="folder to write in (default: the temp folder)")
    p.add_argument("--compare", action="store_true", help="also SHA-256 and BLAKE2b rates")
    args = p.parse_args(argv)

    state = state_dict(args.params_m)
    save_s, hash_s, verify_s = [], [], []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = checkpoints.iteration_dir(tmp, 10)
        (folder / "mp_rank_00").mkdir(parents=True)
        model = folder / "mp_rank_00" / "model_optim_rng.pt"
        for _ in range(args.rounds):
            save_s.append(timed(lambda: torch.save(state, model)))
            hash_s.append(timed(lambda: checksums.write_manifest(folder)))
            verify_s.append(timed(lambda: checksums.problem(folder)))
        size_mb = model.stat().st_size / 1e6
        save, hashing, verify = (statistics.median(x) for x in (save_s, hash_s, verify_s))
        print(f"checkpoint: {size_mb:.0f} MB ({args.params_m:g}M parameters), {args.rounds} rounds")
        print(f"save (torch.save): {save:.2f} s, {size_mb / save:.0f} MB/s")
        print(f"checksums at commit (xxh3_128): {hashing:.2f} s, {size_mb / hashing:.0f} MB/s")
        print(f"verify before a resume: {verify:.2f} s, {size_mb / verify:.0f} MB/s")
        print(f"hashing / save: {hashing / save:.3f}")
        if args.compare:
            for name in ("sha256", "blake2b"):
                print(f"{name} (hashlib): {hashlib_rate(model, name):.0f} MB/s")
    print(f"cores: {len(os.sched_getaffinity(0))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
