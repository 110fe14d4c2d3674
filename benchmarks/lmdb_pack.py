"""Benchmark of pack_lmdb and the LMDB reader (not part of the test suite).

    .venv/bin/python benchmarks/lmdb_pack.py [--images 20000] [--work /tmp/hpcllm-lmdb-bench]
    .venv/bin/python benchmarks/lmdb_pack.py --images 2000 --size 400x300 --job --reads 0
    .venv/bin/python benchmarks/lmdb_pack.py --images 2000 --size 400x300 --job \
        --snakemake-job --compare main --reads 0 --repeats 5

Generates (once) an ImageNet-style tree of real JPEGs of about 100 KB, then prints, as
medians of --repeats runs:
- packing: images/s and MB/s of pack_lmdb (listing, reading, checking, writing, fsync),
  and with --compare-read-ahead / --compare-writeback without those two levers;
- the ceiling: ``tar -cf`` of the same folder to the same disk, alone and followed by
  ``sync`` (the durable equivalent of a pack, which ends with an fsync; the pack is
  timed with a ``sync`` after it too), and pack_lmdb's speed as a fraction of each,
  measured in the same run: the runs alternate pack, tar, tar + sync;
- with --job, the pack as its job's command runs it (the pack_lmdb rule's shell command,
  ``python -m hpcllm.vision.pack_job``: a fresh Python, its imports, the pack, then sync;
  with --compare-sizes, the same with other transaction and read-ahead sizes);
- with --snakemake-job, the whole job as a cluster runs it: ``python -m snakemake --mode
  remote`` for pack_lmdb (Snakemake's start, the Snakefile parsed, the rule's command),
  then sync; with --compare REF also the same job of the workflow at git revision REF
  (e.g. main, when pack_lmdb was a ``script:`` rule), in the same rounds.
  For a small split (--images 2000 --size 400x300: 2,000 JPEGs, ~123 MB) the job's start
  is a large part of the job.
- random access (unless --reads 0), single process and with 2 DataLoader workers: images/s of the LMDB
  reader (bytes only, and with Pillow decode to RGB) against reading the same images
  from the folder.
The source files are in the page cache for all of it (read once before timing), so the
figures compare the software, not a cold parallel file system.
"""

from __future__ import annotations

import argparse
import io
import json
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

REPO = Path(__file__).resolve().parents[1]
DATASET = "bench"  # the dataset's name in the Snakemake case's config


def job_command(tree: Path, out: Path, threads: int) -> list[str]:
    """The pack_lmdb rule's shell command (workflow/rules/vision.smk) for the tree, with
    the params as the rule passes them (their Python literals)."""
    cfg = {"layout": "imagenet", "root": str(tree), "splits": ["train"]}
    return [
        sys.executable, "-m", "hpcllm.vision.pack_job", "--dataset", DATASET,
        "--dataset-config", repr(cfg), "--vision", "{}", "--split", "train",
        "--lmdb", str(out / "job.lmdb"), "--report", str(out / "job.report.json"),
        "--log", str(out / "job.log"), "--threads", str(threads),
    ]  # fmt: skip


# The job's module with other transaction and read-ahead sizes (MB), for --compare-sizes.
SIZED = """
import sys
from hpcllm.vision import lmdb_pack, pack_job
lmdb_pack.pack_lmdb.__kwdefaults__["txn_bytes"] = int(sys.argv[1]) << 20
lmdb_pack.pack_lmdb.__kwdefaults__["read_ahead_bytes"] = int(sys.argv[2]) << 20
pack_job.main(sys.argv[3:])
"""


def job(tree: Path, out: Path, threads: int, sizes: tuple[int, int] | None = None) -> None:
    """The job's command in a fresh Python (``sizes``: the transaction and read-ahead MB
    instead of the defaults), then sync."""
    shutil.rmtree(out / "job.lmdb", ignore_errors=True)
    cmd = job_command(tree, out, threads)
    if sizes:
        cmd = [sys.executable, "-c", SIZED, *map(str, sizes), *cmd[3:]]
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    sync()


def snakemake_case(work: Path, tree: Path) -> Path:
    """A working folder whose config packs ``tree`` as the dataset ``bench`` (its train
    split), for the real Snakemake job."""
    import yaml

    case = work / "snakemake-case"
    (case / "config").mkdir(parents=True, exist_ok=True)
    for name in ("resources", "profiles"):
        if not (case / name).exists():
            (case / name).symlink_to(REPO / name)
    for item in (REPO / "config").iterdir():
        if item.name != "config.yaml" and not (case / "config" / item.name).exists():
            (case / "config" / item.name).symlink_to(item)
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["vision"]["datasets"] = {
        DATASET: {"layout": "imagenet", "root": str(tree), "splits": ["train"]}
    }
    (case / "config" / "config.yaml").write_text(json.dumps(config))
    return case


def export_revision(ref: str, work: Path) -> Path:
    """The workflow's files at git revision ``ref`` (its Snakefile puts its own src first
    on the path, so its package is the one its job imports)."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", ref],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    folder = work / f"rev-{commit}"
    if not folder.exists():
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True
        ).stdout
        folder.mkdir()
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def snakemake_job(case: Path, snakefile: Path, threads: int, dry: bool = False) -> None:
    """pack_lmdb as Snakemake's executors run one job (``--mode remote``, the job
    process of a Slurm job): Snakemake starts, parses the Snakefile, runs the rule;
    ``dry``: the same with ``-n``, all but running the rule."""
    if not dry:
        shutil.rmtree(case / "data" / "vision" / DATASET, ignore_errors=True)
    cmd = [
        sys.executable, "-m", "snakemake", "--snakefile", str(snakefile),
        "--target-jobs", f"pack_lmdb:dataset={DATASET},split=train",
        "--allowed-rules", "pack_lmdb", "--cores", str(threads), "--attempt", "1",
        "--force-use-threads", "--force", "--nolock", "--no-hooks",
        "--target-files-omit-workdir-adjustment", "--max-inventory-time", "0",
        "--ignore-incomplete", "--quiet", "all", "--mode", "remote", *(["-n"] if dry else []),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=case, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the Snakemake job of {snakefile} failed:\n{proc.stderr[-3000:]}")
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
        "--snakemake-job",
        action="store_true",
        help="also time pack_lmdb as Snakemake runs one job on a cluster (python -m "
        "snakemake --mode remote: Snakemake's start, the Snakefile parsed, the rule run), "
        "then sync",
    )
    parser.add_argument(
        "--compare",
        metavar="REF",
        help="with --snakemake-job, also time the Snakemake job of the workflow at this git "
        "revision (e.g. main) in the same rounds",
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
    snakefiles = {}  # name -> the Snakefile of a Snakemake job
    if args.snakemake_job:
        case = snakemake_case(args.work, tree)
        snakefiles["Snakemake job"] = REPO / "Snakefile"
        if args.compare:
            rev = export_revision(args.compare, args.work)
            snakefiles[f"Snakemake job at {args.compare} ({rev.name[4:]})"] = rev / "Snakefile"
        for name, snakefile in snakefiles.items():
            snakemake_job(case, snakefile, args.threads)  # once untimed: bytecode, caches
            pack_s[name] = []
    dry_s: dict[str, list[float]] = {}  # the Snakemake jobs with -n: no rule run
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
        for name, snakefile in snakefiles.items():
            sync()
            pack_s[name].append(
                timed_cpu(name, lambda: snakemake_job(case, snakefile, args.threads))  # noqa: B023
            )
            dry_s.setdefault(name, []).append(
                timed_cpu(f"{name}, -n", lambda: snakemake_job(case, snakefile, 1, dry=True))  # noqa: B023
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
        print(f"ratio {name}/(tar -cf): {_ratio(t / p)}")
        print(f"ratio {name}/(tar -cf + sync): {_ratio(ts / p)} (target >= 0.9)")
    cpu = {name: statistics.median(runs) for name, runs in CPU_S.items()}
    print("CPU seconds (median): " + ", ".join(f"{n} {c:.2f}" for n, c in cpu.items()))
    for name in pack_s:
        print(f"CPU ratio {name}/(tar -cf + sync): {cpu[name] / cpu['tar -cf + sync']:.2f}")
    for name, runs in dry_s.items():
        # per round, so that both halves of a difference ran under the same load
        wall = statistics.median(a - b for a, b in zip(pack_s[name], runs))
        used = statistics.median(a - b for a, b in zip(CPU_S[name], CPU_S[f"{name}, -n"]))
        print(
            f"{name}, -n (no rule run): {statistics.median(runs):.2f} s, CPU "
            f"{cpu[name + ', -n']:.2f} s; the rule's part (the job less its -n run, "
            f"median of the rounds): {wall:.2f} s, CPU {used:.2f} s"
        )
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


def _ratio(x: float) -> str:
    """Two decimals; two significant digits below 0.01 (a Snakemake job on tiny data)."""
    return f"{x:.2f}" if x >= 0.01 else f"{x:.2g}"


def _fmt(xs: list[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in xs)


if __name__ == "__main__":
    main()
