"""Training segments planned again over a checkpoint that already holds them.

A segment's job trains from the checkpoint to the segment's target; where the checkpoint
holds that target already, it trains nothing and restores the record that the job that
trained it kept. That is right where Snakemake reruns the job for its record alone
(missing, or left incomplete by a killed controller). Where the rerun was asked for
(``--forcerun``, ``-R``, ``-F``) or the segment's data was made again, the jobs would
train nothing, and the old model would be exported and evaluated as if it were new: the
plan is refused before anything is submitted, naming the command that trains again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

# Snakemake's reasons (snakemake.jobs.Reason.get_names) that ask for new training.
ASKED = {
    "forced": "forced (--forcerun, -R or -F)",
    "updated input files": "its data was made again",
    "input files updated by another job": "its data is made again in this run",
}


def asked(
    experiment: str,
    forced_by_user: bool,
    updated_input: Iterable[str],
    updated_input_run: Iterable[str],
) -> list[str]:
    """Snakemake's reasons of a segment job that ask for new training: forced by the
    user's flags (not by --rerun-incomplete: a killed controller's segment, whose record
    alone is missing and which its job restores), or its data made again (not the segment
    before's record, the image or the pre-flight)."""
    names = ["forced"] if forced_by_user else []
    other = (f"results/train/{experiment}/", "containers/", "results/preflight/")
    for name, files in (
        ("updated input files", updated_input),
        ("input files updated by another job", updated_input_run),
    ):
        if any(not str(f).startswith(other) for f in files):
            names.append(name)
    return names


def stale_reruns(
    planned: Iterable[tuple[str, int, Iterable[str]]],
    reached: Callable[[str], int | None],
    target: Callable[[str, int], int],
) -> dict[str, list[tuple[int, str]]]:
    """Per experiment, (segment, why) of the planned segment jobs (experiment, segment,
    Snakemake's reasons) that were asked for but whose target the checkpoint holds."""
    found: dict[str, list[tuple[int, str]]] = {}
    for experiment, segment, reasons in planned:
        asked = [ASKED[r] for r in reasons if r in ASKED]
        holds = reached(experiment)
        if asked and holds is not None and holds >= target(experiment, segment):
            found.setdefault(experiment, []).append((segment, asked[0]))
    return {e: sorted(s) for e, s in found.items()}


def refusal(experiment: str, segments: list[tuple[int, str]], holds: int) -> str:
    listed = ", ".join(f"{k} ({why})" for k, why in segments)
    records = " ".join(f"results/train/{experiment}/seg{k}.json" for k, _ in segments)
    return (
        f"training.experiments.{experiment}: segments {listed} are planned again, but "
        f"checkpoints/{experiment} holds iteration {holds}, past their targets: their jobs "
        "would train nothing, and the model trained before would be exported and evaluated "
        f"as if it were new. To train it again on its data: `hpcllm restart-training "
        f"{experiment}` (moves its checkpoints, records and logs aside), then the same "
        "command. To keep the model instead: leave out the --forcerun, -R or -F that asked "
        "for them; where their data was made again with the same content, mark the records "
        f"current with the same command and --touch {records}"
    )
