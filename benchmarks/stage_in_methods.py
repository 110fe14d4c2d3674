"""Stage-in by per-node copy against Slurm's sbcast, on the project's test Slurm cluster
(not part of the test suite; needs root, slurm-wlm and munge, see docs/slurm-tests.md).

    sudo .venv/bin/python benchmarks/stage_in_methods.py [--mb 512] [--repeats 3]

Starts the two-node test cluster (tests/slurm/testcluster.py), gives each node its own
tmpfs as node-local storage (mounted inside the node's slurmd mount namespace, so n1 and
n2 really hold separate copies although they share one host), writes an LMDB of --mb MB
of random records in the shared temporary directory, and runs one two-node job that
stages it --repeats times with each method (alternating) through
``python -m hpcllm.vision.stage_job``. Prints per method the median over the runs of
the slowest node's time, and the runs' per-node times.

On this one-host cluster the "shared file system" is the host's page cache and both
nodes share its cores, so the figures compare the mechanisms' overheads, not a
parallel file system against a broadcast tree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import lmdb

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "slurm"))

from testcluster import free_port, running  # noqa: E402


def write_lmdb(path: Path, megabytes: int, record_kb: int = 100) -> None:
    count = megabytes * 1024 // record_kb
    env = lmdb.open(str(path), map_size=(megabytes + 64) << 20, lock=False)
    with env.begin(write=True) as txn:
        for i in range(count):
            txn.put(b"%08d" % i, os.urandom(record_kb * 1024), append=True)
    env.sync(True)
    env.close()


def node_tmpfs(cluster, mount_point: Path, megabytes: int) -> None:
    """A tmpfs at ``mount_point`` in each node's own mount namespace."""
    mount_point.mkdir()
    for node in cluster.nodes:
        pid = int((cluster.root / f"slurmd-{node}.pid").read_text().split()[0])
        subprocess.run(
            ["nsenter", "-t", str(pid), "-m", "mount", "-t", "tmpfs", "-o",
             f"size={2 * megabytes + 1200}m", f"hpcllm-{node}", str(mount_point)],
            check=True,
        )  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, list[dict[str, float]]]:
    """Prints the figures; returns method -> the runs' seconds per node."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=512, help="size of the LMDB")
    parser.add_argument("--repeats", type=int, default=3, help="stage-ins per method")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hpcllm-stage-bench-") as tmp:
        root = Path(tmp)
        source = root / "shared" / "bench" / "train.lmdb"
        source.parent.mkdir(parents=True)
        write_lmdb(source, args.mb)
        print(f"LMDB: {(source / 'data.mdb').stat().st_size / 1e6:.0f} MB", flush=True)
        with running(root / "cluster") as cluster:
            local = root / "local"
            node_tmpfs(cluster, local, args.mb)
            port = free_port()
            steps = "\n".join(
                f"srun {sys.executable} -m hpcllm.vision.stage_job --method {method} "
                f"--dest {local} --master $MASTER:{port} {source}"
                for _ in range(args.repeats)
                for method in ("copy", "sbcast")
            )
            script = root / "job.sh"
            script.write_text(
                "#!/bin/bash\n"
                "MASTER=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -1)\n"
                f"export PYTHONPATH={REPO / 'src'}\n{steps}\n"
            )
            out = root / "job.out"
            cluster.run(
                "sbatch", "--wait", "-N", "2", "--ntasks-per-node=1", "-o", str(out),
                str(script), timeout=3600, check=False,
            )  # fmt: skip
            text = out.read_text() if out.is_file() else ""
            records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    if len(records) != 2 * args.repeats:
        sys.exit(
            f"expected {2 * args.repeats} stage-in records, got {len(records)}:\n{text[-4000:]}"
        )
    result = {}
    for method in ("copy", "sbcast"):
        runs = [r["seconds_per_node"] for r in records if r["method"] == method]
        result[method] = runs
        slowest = [max(r.values()) for r in runs]
        per_node = "; ".join(", ".join(f"{n} {s:.2f}" for n, s in sorted(r.items())) for r in runs)
        print(
            f"{method:7} median {statistics.median(slowest):6.2f} s (slowest node), "
            f"{args.mb / statistics.median(slowest):6.0f} MB/s; runs: {per_node}"
        )
    return result


if __name__ == "__main__":
    main()
