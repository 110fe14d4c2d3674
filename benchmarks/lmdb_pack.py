"""Benchmark of pack_lmdb and the LMDB reader (not part of the test suite).

    .venv/bin/python benchmarks/lmdb_pack.py [--images 20000] [--work /tmp/hpcllm-lmdb-bench]
    .venv/bin/python benchmarks/lmdb_pack.py --images 2000 --size 400x300 --job --reads 0

Generates (once) an ImageNet-style tree of real JPEGs of about 100 KB, then prints, as
medians of --repeats runs:
- packing: images/s and MB/s of pack_lmdb (listing, reading, checking, writing, fsync),
  and with --compare-read-ahead / --compare-writeback without those two levers;
- the ceiling: ``tar -cf`` of the same folder to the same disk, alone and followed by
  ``sync`` (the durable equivalent of a pack, which ends with an fsync; the pack is
  timed with a ``sync`` after it too), and pack_lmdb's speed as a fraction of each,
  measured in the same run: the runs alternate pack, tar, tar + sync;
- with --job, the pack as its job runs it, process start included (and with
  --compare-sizes, the same with other transaction and read-ahead sizes): a fresh Python that
  makes the pack_lmdb script's imports, then packs (pack_dataset_split) and syncs; for a
  small split (--images 2000 --size 400x300: 2,000 JPEGs, ~130 MB) the start is a large
  part of the job. (Snakemake's own job process around it is benchmarks/job_overhead.py's.)
- random access (unless --reads 0), single process and with 2 DataLoader workers: images/s of the LMDB
  reader (bytes only, and with Pillow decode to RGB) against reading the same images
  from the folder.
The source files are in the page cache for all of it (read once before timing), so the
figures compare the software, not a cold parallel file system.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from PIL import Image
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from hpcllm.vision import lmdb_pack  # noqa: E402
from hpcllm.vision.lmdb_dataset import LMDBImageDataset  # noqa: E402
from hpcllm.vision.lmdb_env import close_environment  # noqa: E402
from hpcllm.vision.lmdb_pack import pack_lmdb  # noqa: E402
from hpcllm.vision.sample_data import write_sample_tree  # noqa: E402
from hpcllm.vision.trees import list_split  # noqa: E402

# The pack_lmdb job's script from its imports on, timed from before the interpreter starts
# (the scripts' folder after site-packages, as Snakemake puts it).
JOB = """
import sys
sys.path.append(sys.argv[1])
import hpcllm_checkout
from hpcllm.offline import go_offline
go_offline()
from hpcllm import logs
from hpcllm.vision.datasets_config import pack_dataset_split
logs.setup(sys.argv[4])
cfg = {"root": sys.argv[2], "layout": "imagenet"}
if len(sys.argv) > 6:  # other transaction and read-ahead sizes (MB), for --compare-sizes
    from hpcllm.vision import lmdb_pack
    lmdb_pack.pack_lmdb.__kwdefaults__["txn_bytes"] = int(sys.argv[6]) << 20
    lmdb_pack.pack_lmdb.__kwdefaults__["read_ahead_bytes"] = int(sys.argv[7]) << 20
pack_dataset_split("bench", cfg, {}, "train", sys.argv[3], sys.argv[3] + ".report.json",
                   threads=int(sys.argv[5]))
"""
SCRIPTS = Path(__file__).resolve().parents[1] / "workflow" / "scripts"


def job(tree: Path, out: Path, threads: int, sizes: tuple[int, int] | None = None) -> None:
    """``sizes``: the transaction and read-ahead MB instead of the defaults."""
    lmdb = out / "job.lmdb"
    shutil.rmtree(lmdb, ignore_errors=True)
    cmd = [sys.executable, "-c", JOB, str(SCRIPTS), str(tree), str(lmdb), str(out / "job.log")]
    subprocess.run([*cmd, str(threads), *map(str, sizes or ())], check=True)
    sync()


def tree_bytes(folder: Path) -> tuple[int, int]:
    files = [p for p in folder.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def warm_cache(folder: Path) -> None:
    for p in folder.rglob("*"):
        if p.is_file():
            p.read_bytes()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


CPU_S: dict[str, list[float]] = {}  # CPU seconds (this process and its children) per run


def timed_cpu(name: str, fn) -> float:
    """``timed``, also noting the CPU time of the run under ``name``."""

    def used() -> float:
        me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    before = used()
    seconds = timed(fn)
    CPU_S.setdefault(name, []).append(used() - before)
    return seconds


def sync() -> None:
    subprocess.run(["sync"], check=True)


def tar(tree: Path, out: Path, durable: bool) -> None:
    out.unlink(missing_ok=True)
    subprocess.run(["tar", "-cf", str(out), "-C", str(tree), "train"], check=True)
    if durable:
        sync()


class Records(Dataset):
    """Random images by index: from the LMDB or from the folder, bytes only or decoded."""

    def __init__(self, lmdb: Path, root: Path, indices: list[int], source: str, decode: bool):
        self.lmdb, self.root, self.indices = lmdb, root, indices
        self.source, self.decode = source, decode
        self.names = [LMDBImageDataset(lmdb).read_record(i)[2] for i in indices]
        self.dataset = LMDBImageDataset(lmdb)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> int:
        if self.source == "lmdb":
            if self.decode:
                return self.dataset[self.indices[k]][1]
            return len(self.dataset.read_record(self.indices[k])[0])
        data = (self.root / self.names[k]).read_bytes()
        if self.decode:
            return Image.open(io.BytesIO(data)).convert("RGB").size[0]
        return len(data)


def read_rate(records: Records, workers: int) -> float:
    if workers == 0:
        seconds = timed(lambda: [records[k] for k in range(len(records))])
    else:
        loader = DataLoader(records, batch_size=64, num_workers=workers, collate_fn=list)
        seconds = timed(lambda: [b for b in loader])
    return len(records) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=20000, help="JPEGs in the generated tree")
    parser.add_argument("--classes", type=int, default=100, help="class folders of the tree")
    parser.add_argument(
        "--size", default="500x375", help="image width x height (default 500x375: ~100 KB)"
    )
    parser.add_argument(
        "--job",
        action="store_true",
        help="also time the pack as its job runs it: a fresh Python, the pack_lmdb "
        "script's imports, the pack, sync",
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=Path("/tmp/hpcllm-lmdb-bench"),
        help="folder of the tree (kept between runs) and the packed LMDBs",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (medians)")
    parser.add_argument("--threads", type=int, default=4, help="pack_lmdb reader threads")
    parser.add_argument(
        "--reads", type=int, default=3000, help="random reads per measurement (0: none)"
    )
    parser.add_argument(
        "--compare-read-ahead",
        action="store_true",
        help="also pack with the readers only threads x 4 chunks ahead (read_ahead_bytes=0; "
        "the default lets them read two transactions ahead while the writer commits)",
    )
    parser.add_argument(
        "--compare-writeback",
        action="store_true",
        help="also pack without starting the disk writes after each commit (everything is "
        "then written by the fsync at the end)",
    )
    parser.add_argument(
        "--compare-sizes",
        metavar="TXN_MB/AHEAD_MB",
        help="with --job, also run the job with these transaction and read-ahead sizes "
        "(e.g. 64/128, the defaults before issue 51) in the same rounds",
    )
    args = parser.parse_args()

    width, height = map(int, args.size.lower().split("x"))
    tree = args.work / f"imagenet{args.images}" if args.size == "500x375" else (
        args.work / f"imagenet{args.images}_{width}x{height}"
    )  # fmt: skip
    if not tree.is_dir():
        print(f"generating {args.images} images in {tree} ...", flush=True)
        write_sample_tree(
            tree, "imagenet", classes=args.classes, train_per_class=args.images // args.classes,
            val_per_class=1, size=(width, height), noise=25, val_labels="folders", threads=2,
        )  # fmt: skip
    count, size = tree_bytes(tree / "train")
    warm_cache(tree / "train")
    print(f"tree: {count} images, {size / 1e6:.0f} MB, {size / count / 1e3:.0f} KB each")
    out = args.work / "out"
    out.mkdir(exist_ok=True)

    start_writeback = lmdb_pack._Writeback.start

    def pack(read_ahead: int, writeback: bool) -> None:
        lmdb_pack._Writeback.start = start_writeback if writeback else lambda self: None
        listing = list_split(tree, "imagenet", "train")
        pack_lmdb(
            listing,
            out / "train.lmdb",
            out / "train.report.json",
            threads=args.threads,
            read_ahead_bytes=read_ahead,
        )
        sync()

    # name -> pack_lmdb's read_ahead_bytes, writeback after each commit
    variants = {"pack_lmdb": (lmdb_pack.READ_AHEAD_BYTES, True)}
    if args.compare_read_ahead:
        variants["pack, no read-ahead"] = (0, True)
    if args.compare_writeback:
        variants["pack, no writeback"] = (lmdb_pack.READ_AHEAD_BYTES, False)
    pack_s = {name: [] for name in variants}
    if args.job:
        pack_s["pack_lmdb job"] = []
    sizes = tuple(map(int, args.compare_sizes.split("/"))) if args.compare_sizes else None
    sized_job = f"job, {args.compare_sizes} MB"
    if args.job and sizes:
        pack_s[sized_job] = []
    tar_s, tar_sync_s = [], []
    for _ in range(args.repeats):  # alternating, so that load on the machine hits all alike
        for name, variant in variants.items():
            shutil.rmtree(out / "train.lmdb", ignore_errors=True)
            sync()
            pack_s[name].append(timed_cpu(name, lambda: pack(*variant)))  # noqa: B023
        if args.job:
            sync()
            pack_s["pack_lmdb job"].append(
                timed_cpu("pack_lmdb job", lambda: job(tree, out, args.threads))
            )
            if sizes:
                sync()
                pack_s[sized_job].append(
                    timed_cpu(sized_job, lambda: job(tree, out, args.threads, sizes))
                )
        sync()
        tar_s.append(timed_cpu("tar -cf", lambda: tar(tree, out / "train.tar", durable=False)))
        sync()
        tar_sync_s.append(
            timed_cpu("tar -cf + sync", lambda: tar(tree, out / "train.tar", durable=True))
        )
    t, ts = statistics.median(tar_s), statistics.median(tar_sync_s)
    for name, runs in pack_s.items():
        p = statistics.median(runs)
        print(
            f"{name:19} {count / p:8.0f} images/s {size / p / 1e6:7.0f} MB/s  (runs {_fmt(runs)} s)"
        )
    print(
        f"{'tar -cf':19} {count / t:8.0f} images/s {size / t / 1e6:7.0f} MB/s  (runs {_fmt(tar_s)} s)"
    )
    print(
        f"{'tar -cf + sync':19} {count / ts:8.0f} images/s {size / ts / 1e6:7.0f} MB/s  (runs {_fmt(tar_sync_s)} s)"
    )
    for name, runs in pack_s.items():
        p = statistics.median(runs)
        print(f"ratio {name}/(tar -cf): {t / p:.2f}")
        print(f"ratio {name}/(tar -cf + sync): {ts / p:.2f} (target >= 0.9)")
    cpu = {name: statistics.median(runs) for name, runs in CPU_S.items()}
    print("CPU seconds (median): " + ", ".join(f"{n} {c:.2f}" for n, c in cpu.items()))
    for name in pack_s:
        print(f"CPU ratio {name}/(tar -cf + sync): {cpu[name] / cpu['tar -cf + sync']:.2f}")
    print(f"load: {os.getloadavg()[0]:.1f} (1 min)")
    (out / "train.tar").unlink()
    if args.reads <= 0:
        return

    lmdb = out / "train.lmdb"
    n = LMDBImageDataset(lmdb).num_samples
    rng = random.Random(0)
    print(f"random access, {args.reads} reads, images/s (median of {args.repeats}):")
    for decode in (False, True):
        for workers in (0, 2):
            rates = {}
            for source in ("lmdb", "folder"):
                runs = []
                for _ in range(args.repeats):
                    indices = rng.sample(range(n), min(args.reads, n))
                    runs.append(read_rate(Records(lmdb, tree, indices, source, decode), workers))
                rates[source] = statistics.median(runs)
            what = "decode " if decode else "bytes  "
            print(
                f"  {what} workers={workers}: LMDB {rates['lmdb']:8.0f}  folder "
                f"{rates['folder']:8.0f}  ratio {rates['lmdb'] / rates['folder']:.2f}"
            )
    close_environment(lmdb)


def _fmt(xs: list[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in xs)


if __name__ == "__main__":
    main()
