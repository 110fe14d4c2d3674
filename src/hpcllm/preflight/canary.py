"""Canaries: each GPU job type's real command line, image and launch script at minimal size.

A canary takes a job the plan will run (a training experiment, a language or vision
benchmark point) and scales it down to one node, or two where jobs of its type run on more
than one (:func:`canary_nodes`: the rendezvous across nodes, the network plugin and a
gradient all-reduce over the fabric, which one node never exercises), a tiny model of the
same parallel layout (as far as one node holds it) and a few iterations, then runs it
through the very code
the GPU job runs (:func:`hpcllm.training.campaign.segment.run_segment`,
:func:`hpcllm.bench.language.run_language_point`,
:func:`hpcllm.bench.runner.run_vision_point`, all launched by :mod:`hpcllm.launch`):
start-up, first iterations and, for training, a checkpoint save (segment 1) and a resume
from it (segment 2). A canary that fails raises CanaryFailed naming the failure class and
its log; the GPU jobs of its type take its record as an input, so none starts.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from hpcllm.atomic import atomic_path
from hpcllm.preflight.probe import facts_of, key_of

log = logging.getLogger(__name__)

ITERATIONS_PER_SEGMENT = 2  # a save at 2, a resume from it to 4
# The canary's job: minutes of its time limit; the segments' margin and signal within it.
RUNTIME_MIN = 20
TIME = {"margin_seconds": 120, "signal_seconds": 60}


class CanaryFailed(RuntimeError):
    """The canary did not get through; its GPU jobs are held back."""


def canary_nodes(largest_job_nodes: int) -> int:
    """The canary's nodes for a job type whose largest planned job has
    ``largest_job_nodes``: two where that is more than one (a failure that shows only
    across nodes, such as a wrong rendezvous host, a bad NCCL_SOCKET_IFNAME or a fabric
    fault, would otherwise hit every multi-node job in turn, each until its time limit);
    else one."""
    return 2 if largest_job_nodes > 1 else 1


def one_node_layout(tp: int, pp: int, gpus: int) -> tuple[int, int, int]:
    """TP, PP and DP on one node of ``gpus`` GPUs, keeping as much of the layout as fits."""
    tp = max(1, min(tp, gpus))
    while gpus % tp:
        tp -= 1
    pp = max(1, min(pp, gpus // tp))
    while (gpus // tp) % pp:
        pp -= 1
    return tp, pp, gpus // (tp * pp)


def tiny_model(tp: int, pp: int) -> dict[str, int]:
    """A model a few hundred thousand parameters large that the layout divides."""
    heads = 4 * tp
    return {
        "num_layers": 2 * pp,
        "hidden_size": 16 * heads,
        "num_attention_heads": heads,
        "seq_length": 64,
    }


def train_canary_experiment(raw: dict[str, Any], cluster, nodes: int = 1) -> dict[str, Any]:
    """The training canary's experiment: ``raw`` (an experiment's config, defaults filled
    in) on ``nodes`` nodes (TP and PP inside one, data parallel across them), a tiny model
    of its layout, 2 segments of 2 iterations, a save at 2."""
    exp = copy.deepcopy(raw)
    lay = exp.setdefault("layout", {})
    gpus = max(1, cluster.gpus_per_node)
    from hpcllm.models.presets import resolve_experiment

    resolved = resolve_experiment("canary", copy.deepcopy(raw))
    tp, pp, dp = one_node_layout(
        resolved["layout"].get("tp", 1), resolved["layout"].get("pp", 1), gpus
    )
    lay.update(nodes=nodes, procs_per_node=gpus, tp=tp, pp=pp)
    # The canary's layout is the one above; with layout: auto, the checkpoint format the
    # segments save in (hpcllm.training.plan.reshard: fully reshardable by default).
    if lay.pop("auto", None) and lay.get("reshardable_checkpoints", "auto") == "auto":
        lay["reshardable_checkpoints"] = True
    if tp == 1:
        lay["sequence_parallel"] = False
    exp["model"] = {**exp.get("model", {}), **tiny_model(tp, pp)}
    exp["model"].pop("ffn_hidden_size", None)
    exp["batch"] = {"micro": 1, "global": dp * nodes}
    exp["optim"] = {**exp.get("optim", {}), "warmup_iters": 1}
    exp.update(
        segments=2,
        iterations_per_segment=ITERATIONS_PER_SEGMENT,
        save_interval=ITERATIONS_PER_SEGMENT,
        eval_interval=ITERATIONS_PER_SEGMENT,
        log_interval=1,
    )
    exp.pop("keep_checkpoints", None)
    exp["time"] = {**exp.get("time", {}), **TIME}
    exp["time"].pop("limit_minutes", None)
    exp.setdefault("data", {}).pop("max_passes", None)
    return exp


def language_canary_point(point: dict[str, Any], cluster, nodes: int = 1) -> dict[str, Any]:
    """The language canary's point: ``point`` on ``nodes`` nodes (TP and PP inside one,
    data parallel across them), a tiny model, 3 iterations."""
    gpus = max(1, cluster.gpus_per_node)
    tp, pp, dp = one_node_layout(point["tp"], point["pp"], gpus)
    dp *= nodes
    model = tiny_model(tp, pp)
    overrides = point.get("model_overrides") or {}
    return {
        **point,
        "id": "canary_language",
        "nodes": nodes,
        "min_nodes": nodes,
        "procs_per_node": gpus,
        "gpus": gpus * nodes,
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "sequence_parallel": point["sequence_parallel"] and tp > 1,
        # The point's preset (its position embedding, attention) at a tiny size.
        "model_overrides": {
            **overrides,
            "model": {
                **overrides.get("model", {}),
                **{k: v for k, v in model.items() if k != "seq_length"},
            },
        },
        "seq_length": model["seq_length"],
        "micro_batch": 1,
        "global_batch": dp,
        "iterations": 3,
        "warmup_iterations": 1,
    }


def vision_canary_point(point: dict[str, Any], cluster, nodes: int = 1) -> dict[str, Any]:
    """The vision canary's point: ``point`` on ``nodes`` nodes, one epoch of 3 batches."""
    gpus = max(1, cluster.gpus_per_node)
    return {
        **point,
        "id": "canary_vision",
        "nodes": nodes,
        "min_nodes": nodes,
        "procs_per_node": gpus,
        "gpus": gpus * nodes,
        "epochs": 1,
        "measured_epoch": 1,
        "max_batches_per_epoch": 3,
    }


def canary_key(cluster, kind: str, image: str | None, geometry: dict[str, Any]) -> str:
    """What a canary checks: the site facts, the image, the Megatron-LM commit and the
    launch geometry (its layout and engine). A param of the rule: a change reruns it."""
    from hpcllm.models.megatron_args import MEGATRON_LM_COMMIT

    return key_of(
        {
            "facts": facts_of(cluster),
            "kind": kind,
            "image": Path(image).name if image else None,
            "megatron_commit": MEGATRON_LM_COMMIT,
            "geometry": geometry,
        }
    )


def rerun_warning(record: str, key: str, image: str | None) -> str | None:
    """Why a probe or canary that passed before runs again (what it checked changed), and
    what that means for this run; None when it does not (no record: a first run).

    Snakemake leaves the jobs after a job that reruns while its output exists and is an
    ``ancient`` input of theirs for the next run (snakemake/snakemake#4166): the GPU
    jobs start with the next command."""
    try:
        old = json.loads(Path(record).read_text()).get("key")
        written = os.path.getmtime(record)
    except (OSError, ValueError, AttributeError):
        return None
    if old != key:
        why = "what it checks changed (the site facts, the image, Megatron-LM or its layout)"
    elif image and os.path.exists(image) and os.path.getmtime(image) > written:
        why = f"{image} is newer than its record"
    else:
        return None
    return (
        f"{record} is made again: {why}. The GPU jobs after it wait for the next "
        "run of this command (Snakemake schedules the jobs after a rerun ancient input "
        "only then, snakemake/snakemake#4166): run the same command again once it passed"
    )


def _fresh(folder: Path) -> Path:
    """The canary's work folder, empty: a canary always starts from nothing."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def write_record(path: str | os.PathLike, kind: str, cluster, key: str, **fields) -> dict:
    record = {
        "kind": kind,
        "cluster": cluster.name,
        "key": key,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "host": socket.gethostname(),
        "node_list": os.environ.get("SLURM_JOB_NODELIST"),
        "ok": True,
        **fields,
    }
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(record, indent=1) + "\n")
    return record


def _failed(kind: str, cluster, failure: str, log_path, message: str) -> CanaryFailed:
    return CanaryFailed(
        f"canary {kind} on {cluster.name} failed ({failure}; see {log_path}): {message}. "
        f"The GPU jobs of this type are held back: fix the cause and run again"
    )


def run_train_canary(
    kind: str, prepared, work: str | os.PathLike, record_path, cluster, key: str,
    container: str | None = None,
) -> dict:  # fmt: skip
    """Segment 1 (iterations 1-2, saved at 2) and segment 2 (resumed from 2, to 4)."""
    from hpcllm.failures.classify import classify_text
    from hpcllm.training.campaign.segment import SegmentIncomplete, run_segment
    from hpcllm.training.checkpoints import tracker as checkpoints
    from hpcllm.training.plan.experiment import Paths

    folder = _fresh(Path(work))
    save = folder / "checkpoints"
    steps = []
    for segment in (1, 2):
        engine_log = folder / f"seg{segment}.engine.log"
        paths = Paths(
            save=str(save),
            record=str(folder / f"seg{segment}.json"),
            engine_log=str(engine_log),
            data_cache=str(folder / "index-cache"),
            tensorboard=str(folder / "tensorboard"),
        )
        try:
            done = run_segment(f"canary_{kind}", prepared, segment, paths, cluster, container)
        except SegmentIncomplete as e:  # (a canary's rerun starts afresh: no resume hint)
            message = str(e).split("; the next attempt or a rerun")[0]
            raise _failed(kind, cluster, e.failure, engine_log, message) from None
        except Exception as e:  # refused settings, bad data: the same for the real jobs
            failure = classify_text(f"{type(e).__name__}: {e}") or "error"
            raise _failed(kind, cluster, failure, engine_log, f"{type(e).__name__}: {e}") from e
        expected_from = (segment - 1) * ITERATIONS_PER_SEGMENT
        if done["resumed_from_iteration"] != expected_from:
            raise _failed(
                kind, cluster, "error", engine_log,
                f"segment {segment} started from iteration {done['resumed_from_iteration']}, "
                f"not from the checkpoint of iteration {expected_from}",
            )  # fmt: skip
        steps.append(
            {
                "segment": segment,
                "resumed_from_iteration": done["resumed_from_iteration"],
                "last_iteration": done["last_iteration"],
                "checkpoint": done["checkpoint"],
                "seconds": done["seconds"],
                "lm_loss": done["lm_loss"],
            }
        )
    saved = checkpoints.latest_iteration(str(save))
    shutil.rmtree(save, ignore_errors=True)  # proven; not kept
    return write_record(
        record_path, kind, cluster, key, engine=prepared.experiment["engine"],
        image=container, nodes=prepared.experiment["layout"]["nodes"], gpus=prepared.layout.gpus,
        latest_checkpoint=saved, segments=steps,
    )  # fmt: skip


def _bench_record(
    kind: str, cluster, key: str, run: dict, log_path, record_path, container, point: dict
):
    if run["status"] != "ok":
        raise _failed(
            kind, cluster, run["status"], log_path,
            f"the run ended with exit code {run['returncode']}",
        )  # fmt: skip
    return write_record(
        record_path, kind, cluster, key, image=container, nodes=point["nodes"],
        gpus=point["gpus"], wall_time_s=run["wall_time_s"], command=run["command"],
    )  # fmt: skip


def run_language_canary(
    kind: str, point: dict, work, record_path, cluster, key: str, container=None,
    time_limit_s: float | None = None,
) -> dict:  # fmt: skip
    from hpcllm.bench.language import run_language_point

    folder = _fresh(Path(work))
    log_path, run_path = folder / "run.log", folder / "run.json"
    run = run_language_point(point, str(log_path), str(run_path), cluster, container, time_limit_s)
    return _bench_record(kind, cluster, key, run, log_path, record_path, container, point)


def run_vision_canary(
    kind: str, point: dict, lmdb: str, val_lmdb: str | None, work, record_path, cluster,
    key: str, container=None, time_limit_s: float | None = None,
) -> dict:  # fmt: skip
    from hpcllm.bench.runner import run_vision_point

    folder = _fresh(Path(work))
    log_path = folder / "run.log"
    run = run_vision_point(
        point, lmdb, str(log_path), str(folder / "run.json"), str(folder / "settings.json"),
        cluster, container, time_limit_s, val_lmdb,
    )  # fmt: skip
    return _bench_record(kind, cluster, key, run, log_path, record_path, container, point)


def bench_point(config: dict, cluster, point_id: str, schema: str) -> dict[str, Any]:
    """The benchmark point ``point_id`` as the plan expands it (hpcllm.bench.sweeps)."""
    from hpcllm.bench.sweeps import expand_all
    from hpcllm.bench.sweeps import facts_of as sweep_facts
    from hpcllm.configuration import load_schema

    points = expand_all(
        config["benchmarks"]["experiments"],
        sweep_facts(cluster),
        schema=load_schema(schema),
        dropped=[],
    )
    for point in points:
        if point.id == point_id:
            return point.row()
    raise CanaryFailed(f"the plan has no benchmark point {point_id} any more; plan again")


def run_canary(
    kind: str, source: str, config: dict, cluster, key: str, work, record_path,
    container: str | None = None, inputs: dict | None = None, schema: str | None = None,
    time_limit_s: float | None = None, nodes: int = 1,
) -> dict:  # fmt: skip
    """The canary of ``kind`` (train_<engine>, language_<engine>, vision) scaled down from
    ``source`` (an experiment's name or a benchmark point's id) of the plan's config, on
    ``nodes`` nodes (:func:`canary_nodes`)."""
    family = kind.partition("_")[0]
    if family == "train":
        from hpcllm.training.plan.experiment import prepare_experiment

        raw = train_canary_experiment(config["training"]["experiments"][source], cluster, nodes)
        prepared = prepare_experiment(f"canary_{kind}", raw, config["text"], cluster)
        return run_train_canary(kind, prepared, work, record_path, cluster, key, container)
    point = bench_point(config, cluster, source, schema)
    if family == "language":
        point = language_canary_point(point, cluster, nodes)
        return run_language_canary(
            kind, point, work, record_path, cluster, key, container, time_limit_s
        )
    point = vision_canary_point(point, cluster, nodes)
    inputs = inputs or {}
    return run_vision_canary(
        kind, point, inputs["lmdb"], inputs.get("val"), work, record_path, cluster, key,
        container, time_limit_s,
    )  # fmt: skip
