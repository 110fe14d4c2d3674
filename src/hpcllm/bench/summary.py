"""One row per run: every parameter of its sweep point, every metric, and a status.

Status: ``ok``; a failure class from :mod:`hpcllm.failures.classify` (``out_of_memory``,
``node_failure``, ``time_limit``, ``nccl_error``, ``rendezvous_error``, ``cancelled``,
``error``); ``held`` (not run: a smaller point of its series failed in the network or at
start-up, :mod:`hpcllm.bench.hold`; the row names it); ``truncated`` (the log was cut
off: metrics are from the complete lines); ``no_iterations`` (the log holds no training
record); ``missing`` (neither record nor log exists).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pandas as pd

from hpcllm.atomic import atomic_path
from hpcllm.bench import metrics
from hpcllm.bench.hold import HELD, nodes_text
from hpcllm.bench.logparse import parse_megatron_log, parse_vision_log
from hpcllm.failures.classify import classify_log

log = logging.getLogger(__name__)
GROUP = ["benchmark", "experiment", "model", "scaling", "precision"]
# What a held point's record names: the point that holds it, its nodes, class and log.
HOLD_COLUMNS = ("held_by", "held_by_nodes", "held_by_status", "held_by_log")


def run_dir(results: str | Path, benchmark: str, point_id: str) -> Path:
    return Path(results) / benchmark / point_id


def run_row(point: dict, directory: str | Path, slurm_logs: list[Path] = ()) -> dict:
    """The summary row of one run from its ``run.json`` record and ``run.log``."""
    directory = Path(directory)
    record_path, log_path = directory / "run.json", directory / "run.log"
    row = {k: v for k, v in point.items() if not isinstance(v, dict | list)}
    row["log"] = str(log_path)
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    row["returncode"] = record.get("returncode")
    row["wall_time_s"] = record.get("wall_time_s")
    row["slurm_job_id"] = record.get("slurm_job_id")
    if record.get("status") == HELD:  # not run: no metrics, not a failure of its own
        row["status"] = HELD
        row.update({k: record.get(k) for k in HOLD_COLUMNS})
        return row
    if not log_path.is_file():
        row["status"] = record.get("status", "missing") if record else "missing"
        if row["status"] == "missing":
            row["status"] = classify_log(list(slurm_logs), record.get("slurm_state")) or "missing"
        return row
    status = record.get("status")
    if status in (None, "error"):
        # No record, or a failure the runner could not name from its own log: the Slurm
        # job log may say more (a node failure, the job's time limit).
        status = classify_log([log_path, *slurm_logs], record.get("slurm_state")) or status
    if status is None:
        status = "error" if record.get("returncode") not in (None, 0) else "ok"
    try:
        if point["benchmark"] == "language":
            parsed = parse_megatron_log(log_path)
            row.update(
                metrics.language_run_metrics(
                    parsed.iterations,
                    warmup=point.get("warmup_iterations", 0),
                    gpus=point["gpus"],
                    seq_length=point["seq_length"],
                    peak_tflops=point.get("peak_tflops"),
                )
            )
            empty, truncated = not parsed.iterations, parsed.truncated
        else:
            parsed = parse_vision_log(log_path)
            row.update(
                metrics.vision_run_metrics(
                    parsed.batches,
                    parsed.epochs,
                    measured_epoch=point["measured_epoch"],
                    gpus=point["gpus"],
                )
            )
            start = parsed.start or {}
            row["model_impl"] = start.get("model_impl")
            stage = parsed.stage_in or {}
            per_node = stage.get("seconds_per_node") or {}
            row["stage_in_method"] = stage.get("method")
            # the job waits for its slowest node
            row["stage_in_s"] = max(per_node.values()) if per_node else math.nan
            row["stage_in_nodes"] = len(per_node)
            flops = start.get("train_flops_per_image")
            if flops and "images_per_s_per_gpu" in row:
                row["tflops_per_gpu"] = row["images_per_s_per_gpu"] * flops / 1e12
                row["mfu"] = metrics.mfu(row["tflops_per_gpu"], point.get("peak_tflops"))
            empty = not parsed.epochs
            truncated = parsed.truncated or (bool(parsed.start) and parsed.end is None)
    except (ValueError, KeyError, TypeError) as e:  # a log we cannot read is a run we mark
        log.warning("%s: cannot compute metrics: %s", log_path, e)
        row["status"], row["error"] = "unreadable", f"{type(e).__name__}: {e}"
        return row
    if status == "ok" and empty:
        status = "no_iterations"
    elif status == "ok" and truncated:
        status = "truncated"
    row["status"] = status
    return row


def add_efficiencies(df: pd.DataFrame) -> pd.DataFrame:
    """Scaling efficiencies against the smallest node count of the sweep.

    The baseline is never another point: when the smallest one failed, its series has
    no efficiencies (``baseline_nodes`` still names it), instead of efficiencies against
    whichever point happened to succeed.
    """
    df = df.copy()
    for col in (
        "baseline_nodes",
        "efficiency",
        "efficiency_epoch_time",
        "efficiency_train_time",
        "efficiency_batch_time",
    ):
        df[col] = math.nan
    if df.empty:
        return df
    for _, series in df.groupby(GROUP, dropna=False):
        base = series.loc[series["nodes"].idxmin()]
        df.loc[series.index, "baseline_nodes"] = base["nodes"]
        if base["status"] != "ok":
            continue
        for idx, run in series[series["status"] == "ok"].iterrows():
            if run["benchmark"] == "language":
                df.loc[idx, "efficiency"] = metrics.efficiency_from_throughput(
                    run["tokens_per_s_per_gpu"], base["tokens_per_s_per_gpu"]
                )
                continue
            # An epoch is the same images at every node count (EPICURE's weak scaling:
            # fixed per-GPU batch, fixed dataset); a batch is the same images per GPU.
            for name, col in (("epoch", "epoch_time_s"), ("train", "train_time_s")):
                df.loc[idx, f"efficiency_{name}_time"] = metrics.efficiency_from_time(
                    run[col], run["gpus"], base[col], base["gpus"], "total"
                )
            df.loc[idx, "efficiency_batch_time"] = metrics.efficiency_from_time(
                run["median_batch_time_s"], 1, base["median_batch_time_s"], 1, "per_gpu"
            )
            df.loc[idx, "efficiency"] = metrics.efficiency_from_throughput(
                run["images_per_s_per_gpu"], base["images_per_s_per_gpu"]
            )
    return df


def summarize(
    points: list[dict], results: str | Path, slurm_log_root: str | Path | None = None
) -> pd.DataFrame:
    rows = []
    for point in points:
        slurm_logs = (
            sorted(
                Path(slurm_log_root).glob(f"rule_bench_{point['benchmark']}/{point['id']}/*.log")
            )
            if slurm_log_root
            else []
        )
        rows.append(run_row(point, run_dir(results, point["benchmark"], point["id"]), slurm_logs))
    df = pd.DataFrame(rows)
    if df.empty:
        df = pd.DataFrame(columns=["id", *GROUP, "nodes", "gpus", "status"])
    df = add_efficiencies(df).sort_values(
        ["benchmark", "experiment", "model", "scaling", "precision", "nodes"]
    )
    return with_integers(df, [*integer_columns(rows), "baseline_nodes"])


def integer_columns(rows: list[dict]) -> list[str]:
    """The columns whose values are all Python integers where present (counts, ids)."""
    kinds: dict[str, set[type]] = {}
    for row in rows:
        for key, value in row.items():
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                kinds.setdefault(key, set()).add(type(value))
    return [key for key, types in kinds.items() if types == {int}]


def with_integers(df: pd.DataFrame, columns) -> pd.DataFrame:
    """``columns`` as nullable integers: pandas makes a column with a missing value
    float, so ``nodes`` or a job id would otherwise read ``2.0``."""
    df = df.copy()
    for col in columns:
        if col in df and df[col].dtype.kind in "fiu" or (col in df and df[col].isna().all()):
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("Int64")
    return df


def write_summary(df: pd.DataFrame, path: str | Path) -> None:
    """Every column, for tools (integer columns as integers, see :func:`summarize`)."""
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)


# The compact table: what a reader compares across a sweep, rounded for reading.
# (column in the summary, heading, digits after the point; None: as it is)
COMPACT_COLUMNS = (
    ("benchmark", "benchmark", None),
    ("experiment", "experiment", None),
    ("model", "model", None),
    ("scaling", "scaling", None),
    ("precision", "precision", None),
    ("nodes", "nodes", None),
    ("gpus", "GPUs", None),
    ("throughput_per_gpu", "per GPU /s", 1),
    ("unit", "unit", None),
    ("efficiency", "eff", 2),
    ("efficiency_epoch_time", "eff t_ep", 2),
    ("efficiency_train_time", "eff t_tr", 2),
    ("efficiency_batch_time", "eff batch", 2),
    ("tflops_per_gpu", "TFLOP/s/GPU", None),  # see SIGNIFICANT_DIGITS
    ("status", "status", None),
    ("held_by_text", "held by", None),
)
# Columns rounded to significant digits instead: a CPU process's 0.004 TFLOP/s would
# read 0.0 with one decimal.
SIGNIFICANT_DIGITS = {"tflops_per_gpu": 3}


def round_significant(values: pd.Series, digits: int) -> pd.Series:
    """``values`` to ``digits`` significant digits (0.0041234 -> 0.00412, 312.45 -> 312.0)."""

    def rounded(v: float) -> float:
        if not v or math.isnan(v):
            return v
        return round(v, digits - 1 - math.floor(math.log10(abs(v))))

    return pd.to_numeric(values, errors="coerce").map(rounded)


def compact_table(df: pd.DataFrame) -> pd.DataFrame:
    """One short row per run: nodes, scaling, precision, throughput per GPU (tokens or
    images), the efficiency per timing, status; floats rounded, integers as integers."""
    df = df.copy()
    language = df.get("benchmark", pd.Series(dtype=object)) == "language"
    tokens = df.get("tokens_per_s_per_gpu", pd.Series(math.nan, index=df.index))
    images = df.get("images_per_s_per_gpu", pd.Series(math.nan, index=df.index))
    df["throughput_per_gpu"] = tokens.where(language, images)
    df["unit"] = ["tokens" if is_lang else "images" for is_lang in language]
    df["held_by_text"] = [held_by_text(row) for _, row in df.iterrows()]
    out = pd.DataFrame(index=df.index)
    for col, heading, digits in COMPACT_COLUMNS:
        values = df[col] if col in df else pd.Series(math.nan, index=df.index)
        if col in SIGNIFICANT_DIGITS:
            values = round_significant(values, SIGNIFICANT_DIGITS[col])
        elif digits is not None:
            values = pd.to_numeric(values, errors="coerce").round(digits)
        out[heading] = values
    return out.dropna(axis="columns", how="all").reset_index(drop=True)


def held_by_text(row: pd.Series) -> str | None:
    """A held row's "held by" cell: the nodes and failure class of the point holding it."""
    if row.get("status") != HELD:
        return None
    return f"{nodes_text(int(row['held_by_nodes']))}, {row['held_by_status']}"


def hold_notes(df: pd.DataFrame) -> list[str]:
    """One line per point that holds others: which it holds, its class and log, and how
    to release them."""
    if "held_by" not in df:
        return []
    notes = []
    held = df[df["status"] == HELD]
    for holder, rows in held.groupby("held_by", sort=True):
        first = rows.iloc[0]
        record = str(Path(first["held_by_log"]).with_name("run.json"))
        notes.append(
            f"held, not run: {', '.join(rows['id'])}: {holder} failed with "
            f"{first['held_by_status']} (log: {first['held_by_log']}); rerun it (delete "
            f"its folder, or snakemake --forcerun {record}) and they run after it"
        )
    return notes


def format_table(table: pd.DataFrame) -> str:
    """The compact table as fixed-width text (missing values blank), for logs and terminals."""
    if table.empty:
        return "no benchmark runs"
    return table.astype(object).where(table.notna(), "").to_string(index=False)


def write_compact(df: pd.DataFrame, path: str | Path) -> str:
    """Write the compact table as text next to the full CSV, with a line on each point
    that holds others; returns the text."""
    text = "".join(line + "\n" for line in [format_table(compact_table(df)), *hold_notes(df)])
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)
    return text
