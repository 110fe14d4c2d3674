"""Helpers of the training tests: running the workflow in a working directory."""

from __future__ import annotations

from pathlib import Path

from support import REPO, make_workdir, run_snakemake, snakemake_bin, with_examples  # noqa: F401


def snakemake_cmd(workdir: Path, *args: str) -> list[str]:
    """The command ``run_snakemake`` runs, for tests that start Snakemake in the background."""
    args = with_examples(args)
    return [snakemake_bin(), "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]


def segment_record(k, spi, job_started, ended, submitted=None, eligible=None, p10=None,
                   p90=None) -> dict:  # fmt: skip
    """Segment k of a campaign of 4 segments of 100 iterations as its job records it:
    100 iterations at ``spi`` s each, its job's Slurm times and its end (the calendar's
    tests)."""
    return {
        "segment": k,
        "segments": 4,
        "resumed_from_iteration": 100 * (k - 1),
        "last_iteration": 100 * k,
        "timing": {
            "job": {"id": str(k), "submitted": submitted, "eligible": eligible,
                    "started": job_started},
            "training_started": job_started + 5,
            "ended": ended,
            "seconds_per_iteration": spi,
            "p10": p10,
            "p90": p90,
        },
    }  # fmt: skip
