"""``make gpu-check``: the whole GPU path on one machine in minutes, one table at the end.

Every step runs the project's own code, as the workflow's jobs run it, on a corpus
tokenized here with the project's tokenizer code: both training engines (2 segments, a
save and a resume, distributed optimizer on) through ``run_segment``; the canary of each
job type; a language and a vision benchmark point, read back with the benchmark parsers;
the Hugging Face export of both engines' checkpoints with logits (torch) or loss
(Megatron) compared against the engine; the site probe's checks that apply to a bare
machine. A step that fails is a FAIL row with a one-line reason and the others still
run; a step whose requirement is absent (no GPU, no Megatron-LM, time spent) is a SKIP
row saying why. Exit status 1 when a step failed. On a machine without a GPU (or with
``--device cpu``) it runs at a tiny size: what the tests run (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.util
import json
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

import hpcllm
from hpcllm.bench.language import run_language_point
from hpcllm.bench.logparse import parse_megatron_log, parse_vision_log
from hpcllm.bench.metrics import language_run_metrics, vision_run_metrics
from hpcllm.bench.runner import run_vision_point
from hpcllm.bench.sweeps import expand_all
from hpcllm.bench.sweeps import facts_of as sweep_facts
from hpcllm.clusters import Cluster, Gpu, Internet, load_cluster
from hpcllm.configuration import load_schema
from hpcllm.export.folder import export
from hpcllm.models import megatron_args, megatron_resiliency
from hpcllm.preflight import canary, probe
from hpcllm.text.tokenization import load_tokenizer, tokenize_shard
from hpcllm.text.tokenizer_train import train_bpe
from hpcllm.training.campaign.calendar import iteration_times
from hpcllm.training.campaign.chain_site import probe_record_path
from hpcllm.training.campaign.segment import run_segment, straggler_log_on
from hpcllm.training.engines import megatron_stragglers
from hpcllm.training.engines.command import engine_command
from hpcllm.training.engines.log_lines import log_text_from, parse_log_lines
from hpcllm.training.plan.experiment import Paths, prepare_experiment
from hpcllm.training.plan.settings import weight_settings
from hpcllm.vision.datasets_config import dataset_root, make_sample, pack_dataset_split

REPO = Path(hpcllm.__file__).resolve().parents[2]
TOKENIZER, SOURCE, EOD = "sample_bpe", "sample_en", "<|endoftext|>"

# The sizes: a ~100M GPT (12 x 768, sequence 1024, global batch 32, bf16) on a GPU;
# the tests' tiny model on the CPU. Iterations keep the whole check under 6 minutes.
SIZES: dict[str, dict[str, Any]] = {
    "cuda": {
        "model": {"num_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
                  "seq_length": 1024},
        "batch": {"micro": 8, "global": 32},
        "precision": "bf16",
        "iterations": 20,  # per segment; the point: 20 too
        "warmup": 5,  # iterations left out of the figures
        "vocab": 8000,
        "vision": {"model": "resnet50", "precision": "amp", "batch_per_gpu": 256,
                   "image_size": 224, "workers": 8, "classes": 8, "per_class": 128,
                   "repeat": 12},
    },
    "cpu": {
        "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                  "seq_length": 64},
        "batch": {"micro": 4, "global": 8},
        "precision": "fp32",
        "iterations": 3,
        "warmup": 1,
        "vocab": 2000,
        "vision": {"model": "resnet_tiny", "precision": "fp32", "batch_per_gpu": 4,
                   "image_size": 32, "workers": 0, "classes": 4, "per_class": 6,
                   "repeat": 1},
    },
}  # fmt: skip
COLUMNS = ("step", "result", "s", "tokens/s", "TFLOP/s", "MFU", "images/s", "J/token",
           "J/image", "detail")  # fmt: skip


class Skip(Exception):
    """The step's requirement is absent here; the message says which."""


# What a step returns: its figures, or its figures and a line for the row's detail.
Figures = dict[str, float]
Outcome = Figures | tuple[Figures, str]


@dataclasses.dataclass
class Row:
    step: str
    result: str  # PASS, FAIL or SKIP
    seconds: float = 0.0
    detail: str = ""
    figures: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Check:
    """What the steps share: the machine, the sizes and what earlier steps made."""

    device: str  # "cuda" or "cpu"
    cluster: Cluster
    work: Path
    megatron: str | None  # a Megatron-LM tree at the pin, or None
    size: dict[str, Any]
    made: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def runs_megatron(self) -> bool:
        """Megatron-LM runs here: a tree is given and a GPU seen (steps check the tree)."""
        return bool(self.megatron) and self.device == "cuda"

    @property
    def peak(self) -> float | None:
        gpu = self.cluster.gpu
        return gpu.peak_bf16_tflops if gpu and gpu.peak_bf16_tflops else None


def with_defaults(data: dict, schema_file: Path) -> dict:
    """``data`` validated against its schema with the defaults filled in, as Snakemake's
    ``validate`` does for the workflow's config (jsonschema's recipe for defaults)."""
    import jsonschema

    base = jsonschema.Draft202012Validator

    def fill(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if isinstance(sub, dict) and "default" in sub:
                    instance.setdefault(key, copy.deepcopy(sub["default"]))
        yield from base.VALIDATORS["properties"](validator, properties, instance, schema)

    filling = jsonschema.validators.extend(base, {"properties": fill})
    filling(load_schema(schema_file)).validate(data)
    return data


def this_machine(device: str, megatron: str | None) -> Cluster:
    """The local facts (no scheduler, no container) with this machine's GPU: its peak
    from the cluster file of a site with the same model, where the project has one; the
    Megatron-LM checkout (megatron_lm) and whether Transformer Engine is here, as a
    user's cluster file for a workstation would say."""
    local = load_cluster("local", REPO / "config/clusters")
    # No internet assumed: the jobs run offline anyway, so the probe passes either way.
    local = dataclasses.replace(
        local,
        internet=Internet(login=True, compute=False),
        megatron_lm=megatron,
        transformer_engine=importlib.util.find_spec("transformer_engine") is not None,
    )
    if device == "cpu":
        return local
    import torch

    name = torch.cuda.get_device_name(0)
    memory = torch.cuda.get_device_properties(0).total_memory / 1e9
    peak, fp32 = None, None
    for facts in sorted((REPO / "config/clusters").glob("*.yaml")):
        gpu = (yaml.safe_load(facts.read_text()) or {}).get("gpu") or {}
        family = str(gpu.get("model", "")).split("-")[0].lower()
        if family and family in name.lower().split():
            peak, fp32 = gpu["peak_bf16_tflops"], gpu["peak_fp32_tflops"]
            break
    gpu = Gpu("nvidia", name, round(memory, 1), peak or 0.0, fp32 or 0.0)
    return dataclasses.replace(local, gpus_per_node=1, gpu=gpu, path="(this machine)")


# --- the steps ------------------------------------------------------------------------------


def step_probe(c: Check) -> dict[str, float]:
    """The site probe's checks that apply without a scheduler and container: the modules
    every job type imports (hpcllm.preflight.inside, run by this Python), the GPUs, the
    network NCCL is told to use, local storage and scratch, what the node reaches."""
    engines = {"torch", "megatron"} if c.runs_megatron else {"torch"}
    modules = probe.image_modules(c.cluster, "train", engines) + probe.image_modules(
        c.cluster, "vision", vision_impls={"torchvision"}
    )
    modules = list(dict.fromkeys(modules))
    checks = [probe.check_runtime(c.cluster)]
    # As the probe job runs it without a container: this Python, the checkout on its path.
    argv = probe.inside_launch(c.cluster, "bare", modules).argv
    proc = probe._run(argv, timeout=600)
    inside = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    if inside is None:
        raise RuntimeError(f"hpcllm.preflight.inside failed: {probe._tail(proc.stderr)}")
    checks += [probe.check(f"module {m}", e is None, e or "imports")
               for m, e in inside["modules"].items()]  # fmt: skip
    if c.cluster.gpu is not None:
        checks.append(probe.check_gpus(c.cluster))
    checks.append(probe.check_network(c.cluster, inside))
    os.makedirs(c.cluster.scratch, exist_ok=True)
    checks.append(probe.check_storage("local_storage", c.cluster.local_storage, "this machine"))
    checks.append(probe.check_storage("scratch", c.cluster.scratch, "this machine"))
    checks.append(probe.check_internet(c.cluster))
    checks.append(probe.check_resiliency(inside))
    c.made["probe"] = checks
    failed = [f"{x['check']}: {x['detail']}" for x in checks if not x["ok"]]
    # torchvision is the vision step's concern (it falls back to transformers' ResNet).
    hard = [f for f in failed if not f.startswith("module torchvision")]
    if hard:
        raise RuntimeError(f"{len(hard)} of {len(checks)} checks failed: " + "; ".join(hard))
    write_probe_record(c, modules, checks, inside)
    return {}


def write_probe_record(c: Check, modules: list[str], checks: list[dict], inside: dict) -> Path:
    """The probe's record as the site probe job writes it (probe.run_probe: only when it
    passed), where the segments look for this machine's (the local cluster, no container):
    Megatron's straggler detector is switched on by what it found (straggler_log_on)."""
    path = Path(probe_record_path(c.cluster, None))
    key = probe.probe_key(c.cluster, "bare", modules)
    record = probe.probe_record(c.cluster, "bare", key, checks, inside)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def step_data(c: Check) -> dict[str, float]:
    """The tokenizer (train_bpe) and the tokenized sample corpus (tokenize_shard), at the
    paths the workflow's text stage writes them."""
    corpus = REPO / "resources/sample_text/en.jsonl.zst"
    out = Path(f"data/tokenizers/{TOKENIZER}")
    tok_json = train_bpe([str(corpus)], out, c.size["vocab"], [EOD], sample_documents=2000)
    tok = load_tokenizer(tok_json, eod_token=EOD)
    prefix = Path(f"data/tokenized/{TOKENIZER}/{SOURCE}_text_document")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    stats = tokenize_shard(str(corpus), prefix, tok, EOD)
    c.made["data"] = {"tokens": stats.tokens, "documents": stats.documents}
    return {}


def experiment(c: Check, engine: str) -> dict[str, Any]:
    size = c.size
    raw = {
        "engine": engine,
        "model": {**size["model"], "position_embedding": "rope"},
        "batch": dict(size["batch"]),
        "optim": {"lr": 3.0e-4, "min_lr": 3.0e-5, "warmup_iters": 2},
        "layout": {"nodes": 1, "procs_per_node": 1, "distributed_optimizer": True},
        "precision": size["precision"],
        "data": {"tokenizer": TOKENIZER, "sources": {SOURCE: 1.0}, "split": "98,2,0"},
        "segments": 2,
        "iterations_per_segment": size["iterations"],
        "save_interval": size["iterations"],
        "log_interval": 1,
        "eval_iters": 1,
    }
    return with_defaults({"experiments": {engine: raw}}, schema("training"))["experiments"][engine]


def schema(section: str) -> Path:
    return REPO / f"workflow/schemas/{section}.schema.yaml"


def text_section(c: Check) -> dict[str, Any]:
    tokenizer = {
        "type": "train",
        "vocab_size": c.size["vocab"],
        "special_tokens": [EOD],
        "eod_token": EOD,
    }
    return {"tokenizers": {TOKENIZER: tokenizer}, "tokenize": {"tokenizers": [TOKENIZER]},
            "sources": {SOURCE: {}}}  # fmt: skip


def language_figures(c: Check, log: str | Path, seq_length: int, warmup: int) -> dict[str, float]:
    """tokens/s, TFLOP/s, MFU and energy per token of a Megatron-format log (both engines)."""
    its = parse_megatron_log(log).iterations
    if not its:
        raise RuntimeError(f"{log}: no iteration lines")
    m = language_run_metrics(its, warmup=min(warmup, len(its) - 1), gpus=1,
                             seq_length=seq_length, peak_tflops=c.peak)  # fmt: skip
    return {"tokens/s": m["tokens_per_s"], "TFLOP/s": m["tflops_per_gpu"], "MFU": m["mfu"],
            "J/token": m["energy_j_per_token"]}  # fmt: skip


def iteration_spread(segment_logs: list[Path], warmup: int) -> tuple[Figures, str]:
    """The spread of the last segment's seconds per iteration, for the finish date's
    forecast (calendar.MEASURED_RATE_SPREAD): its 10th and 90th percentile as shares of
    its median, and its median over the first segment's; calendar.iteration_times on each
    segment's logged lines after the first ``warmup``, as the row's other figures."""
    times = []
    for log in segment_logs:
        rows = parse_log_lines(log_text_from(log) or "")
        got = iteration_times(rows[min(warmup, max(len(rows) - 1, 0)) :])
        if got is None:
            raise RuntimeError(f"{log}: no iteration times to measure the spread")
        times.append(got)
    first, last = times[0], times[-1]
    median = last["seconds_per_iteration"]
    figures = {
        "p10/median": last["p10"] / median,
        "p90/median": last["p90"] / median,
        f"segment {len(times)}/1 median": median / first["seconds_per_iteration"],
    }
    text = (
        f"segment {len(times)} s/iteration p10 {figures['p10/median']:.3f} and p90 "
        f"{figures['p90/median']:.3f} of its median {median:.4g} s; median over segment "
        f"1's {figures[f'segment {len(times)}/1 median']:.3f}"
    )
    return figures, text


def straggler_decision(c: Check, prepared) -> tuple[bool, str]:
    """Whether the segments run Megatron's straggler detector, decided by the segments'
    own code from the probe's record (straggler_log_on), and the reason from that record."""
    on = straggler_log_on(prepared.experiment, c.cluster, None)
    setting = megatron_resiliency.setting_of(prepared.experiment)
    found, source = megatron_resiliency.from_record(probe_record_path(c.cluster, None))
    why = f"{found.straggler_text()}; {source}" if found is not None else source
    return on, why if setting == "auto" else f"resiliency: {setting}; {why}"


def straggler_outcome(on: bool, why: str, segment_logs: list[Path]) -> tuple[Figures, str]:
    """What Megatron's straggler detector wrote to the segments' engine logs: how many
    reports, and what megatron_stragglers reads from the newest (the forward time per
    iteration, each rank's throughput over the median of those listed). A RuntimeError
    where the detector was on and no report could be read."""
    if not on:
        return {}, f"straggler detector off: {why}"
    texts = [log_text_from(log) or "" for log in segment_logs]
    found = [megatron_stragglers.reports(text) for text in texts]
    every = [report for per_log in found for report in per_log]
    printed = sum(text.count("MnRtt/Rnk") for text in texts)
    counts = "+".join(str(len(per_log)) for per_log in found)
    if not every:
        raise RuntimeError(
            f"straggler detector on ({why}), but megatron_stragglers read no report from "
            f"the engine logs ({printed} lines with 'MnRtt/Rnk'): "
            + ", ".join(map(str, segment_logs))
        )
    newest = every[-1]
    median = statistics.median(newest.throughput.values())
    relative = {rank: tf / median for rank, tf in newest.throughput.items()} if median else {}
    ranks = ", ".join(f"{rank}: {share:.2f}" for rank, share in sorted(relative.items()))
    figures = {"straggler reports": float(len(every))}
    if relative:
        figures["lowest relative throughput"] = min(relative.values())
    text = (
        f"straggler detector on ({why}): {len(every)} reports read of {printed} printed "
        f"(segments {counts}); newest: forward {newest.fastest[0]:.1f} ms/iteration "
        f"(rank {newest.fastest[1]}) to {newest.slowest[0]:.1f} (rank {newest.slowest[1]}), "
        f"estimated throughput over the median ({median:.2f} TF) by rank {{{ranks}}}"
    )
    return figures, text


def train(c: Check, engine: str) -> tuple[Figures, str]:
    """Two segments through run_segment, as train_segment runs them: segment 1 saves,
    segment 2 resumes from its checkpoint. The figures are segment 2's; the detail its
    iteration times' spread and, for Megatron, its straggler detector's reports."""
    name = f"check_{engine}"
    prepared = prepare_experiment(name, experiment(c, engine), text_section(c), c.cluster)
    folder = c.work / "train" / engine
    per = prepared.experiment["iterations_per_segment"]
    straggler = straggler_decision(c, prepared) if engine == "megatron" else None
    paths = None
    for k in (1, 2):
        paths = Paths(save=str(folder / "checkpoints"), record=str(folder / f"seg{k}.json"),
                      engine_log=str(folder / f"seg{k}.engine.log"),
                      data_cache=str(folder / "index-cache"),
                      tensorboard=str(folder / "tensorboard"))  # fmt: skip
        done = run_segment(name, prepared, k, paths, c.cluster)
        c.made[f"train_{engine}"] = (name, prepared, paths)  # the export: the newest record
        if done["resumed_from_iteration"] != (k - 1) * per:
            raise RuntimeError(f"segment {k} started from iteration "
                               f"{done['resumed_from_iteration']}, not {(k - 1) * per}")  # fmt: skip
    figures = language_figures(c, paths.engine_log, c.size["model"]["seq_length"],
                               c.size["warmup"])  # fmt: skip
    logs = [folder / f"seg{k}.engine.log" for k in (1, 2)]
    spread, detail = iteration_spread(logs, c.size["warmup"])
    figures.update(spread)
    if straggler is not None:
        more, said = straggler_outcome(*straggler, logs)
        figures.update(more)
        detail += f"; {said}"
    return figures, detail


def export_and_compare(c: Check, engine: str) -> dict[str, float]:
    """The export of the engine's last checkpoint; its logits against the torch engine's
    own model (loaded by the engine's loader), or for Megatron its loss on the training
    tokens against the engine's last logged loss."""
    if f"train_{engine}" not in c.made:
        raise Skip(f"train_{engine} wrote no segment record")
    import torch
    import transformers

    name, prepared, paths = c.made[f"train_{engine}"]
    out = c.work / "export" / engine
    weights = weight_settings(prepared, megatron_args.transformer_impl_for(c.cluster))
    info = export(name, paths.record, paths.save, weights, list(prepared.tokenizer_files),
                  prepared.eod_token, out)  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    model = model.to(c.device).eval()
    seq = prepared.experiment["model"]["seq_length"]
    if engine == "torch":
        gap = torch_engine_logit_gap(c, prepared, paths, model, seq)
        if gap > 1e-3:
            raise RuntimeError(f"exported logits differ from the engine's by up to {gap:.2e}")
        return {}
    import numpy as np

    from hpcllm.text.indexed_dataset import read_index

    prefix = prepared.blend.prefixes[0]  # the first 4 sequences of the training tokens
    ids = np.fromfile(f"{prefix}.bin", dtype=read_index(f"{prefix}.idx").dtype)[: 4 * seq]
    tokens = torch.from_numpy(ids.astype(np.int64)).view(4, seq)
    with torch.no_grad():
        loss = model(input_ids=tokens.to(c.device), labels=tokens.to(c.device)).loss.item()
    its = parse_megatron_log(paths.engine_log).iterations
    logged = its[-1].lm_loss if its else math.nan
    if not abs(loss - logged) < 1.0:
        raise RuntimeError(f"exported model's loss {loss:.3f} on training tokens, the "
                           f"engine's last logged {logged:.3f} (iteration {info['iteration']})")  # fmt: skip
    return {}


def torch_engine_logit_gap(c: Check, prepared, paths: Paths, exported, seq: int) -> float:
    """The largest logit difference between the export and the torch engine's model,
    resumed with the engine's own loader from the argv the segment ran."""
    import torch

    from hpcllm.models.planner import pad_vocab
    from hpcllm.training.engines import torch_engine

    argv = engine_command(prepared.experiment, prepared.layout, prepared.blend,
                          prepared.tokenizer_files, paths, 2, None,
                          eod_token=prepared.eod_token)[3:]  # fmt: skip
    args = torch_engine.parser().parse_args(argv)
    vocab = torch_engine.vocabulary(args)[0]
    source = torch_engine.build_model(args, pad_vocab(vocab, 1, args.make_vocab_size_divisible_by))
    params = list(source.parameters())  # the engine's two groups: with and without decay
    groups = [{"params": [p for p in params if p.ndim >= 2]},
              {"params": [p for p in params if p.ndim < 2]}]  # fmt: skip
    try:
        torch_engine.load_checkpoint(paths.save, source, torch.optim.AdamW(groups), args,
                                     torch_engine.init_distributed("cpu"))  # fmt: skip
    finally:
        torch.distributed.destroy_process_group()
    source = source.to(c.device).eval()
    ids = torch.randint(0, exported.config.vocab_size, (2, min(seq, 128)),
                        generator=torch.Generator().manual_seed(0)).to(c.device)  # fmt: skip
    with torch.no_grad():
        return (source(input_ids=ids).logits - exported(input_ids=ids).logits).abs().max().item()


def bench_points(c: Check) -> dict[str, dict[str, Any]]:
    """A language and a vision point as the plan expands them (hpcllm.bench.sweeps)."""
    size, v = c.size, c.size["vision"]
    engine = "megatron" if c.runs_megatron else "torch"
    experiments = {
        "check_language": {
            "benchmark": "language", "engine": engine,
            "models": {"m": {"preset": "tiny", "gpus_per_replica": 1,
                             "strong_global_batch": size["batch"]["global"],
                             "weak_grad_accum": 1}},
            "micro_batch": size["batch"]["micro"], "seq_length": size["model"]["seq_length"],
            "precision": [size["precision"]], "scaling": ["strong"],
            "iterations": size["iterations"], "warmup_iterations": size["warmup"],
            "data": f"data/tokenized/{TOKENIZER}/{SOURCE}_text_document",
            "tokenizer": f"data/tokenizers/{TOKENIZER}/tokenizer.json",
            "max_nodes": {"local": 1},
        },
        "check_vision": {
            "benchmark": "vision", "model": v["model"], "dataset": "check_images",
            "precision": [v["precision"]], "batch_per_gpu": v["batch_per_gpu"],
            "image_size": v["image_size"], "epochs": 2, "measured_epoch": 2,
            "workers": v["workers"], "max_nodes": {"local": 1},
        },
    }  # fmt: skip
    with_defaults({"experiments": experiments}, schema("benchmarks"))
    points = {p.row()["benchmark"]: p.row() for p in expand_all(
        experiments, sweep_facts(c.cluster), schema=load_schema(schema("benchmarks")),
        dropped=[])}  # fmt: skip
    lang = points["language"]
    lang["model_overrides"] = {
        "model": {k: size["model"][k] for k in ("num_layers", "hidden_size", "num_attention_heads")}
    }
    lang["distributed_optimizer"] = True
    points["vision"]["repeat"] = v["repeat"]
    return points


def images(c: Check) -> tuple[str, str]:
    """Generated JPEGs packed into LMDB by the vision stage's own code (train, val)."""
    if "images" not in c.made:
        v = c.size["vision"]
        cfg = {"layout": "imagenet", "sample": {"classes": v["classes"],
               "train_per_class": v["per_class"], "val_per_class": 2}}  # fmt: skip
        make_sample("check_images", cfg, dataset_root("check_images", cfg), os.cpu_count() or 1)
        made = []
        for split in ("train", "val"):
            lmdb = f"data/vision/check_images/{split}.lmdb"
            pack_dataset_split("check_images", cfg, {}, split, lmdb, f"{lmdb}.json", threads=4)
            made.append(lmdb)
        c.made["images"] = tuple(made)
    return c.made["images"]


def step_bench_language(c: Check) -> dict[str, float]:
    point = bench_points(c)["language"]
    folder = c.work / "bench" / "language"
    folder.mkdir(parents=True, exist_ok=True)
    run = run_language_point(point, str(folder / "run.log"), str(folder / "run.json"), c.cluster)
    if run["status"] != "ok":
        raise RuntimeError(f"{point['engine']} point: {run['status']} (exit "
                           f"{run['returncode']}; see {folder / 'run.log'})")  # fmt: skip
    return language_figures(c, folder / "run.log", point["seq_length"], point["warmup_iterations"])


def step_bench_vision(c: Check) -> dict[str, float]:
    point = bench_points(c)["vision"]
    train_lmdb, val_lmdb = images(c)
    folder = c.work / "bench" / "vision"
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "run.log"
    run = run_vision_point(point, train_lmdb, str(log), str(folder / "run.json"),
                           str(folder / "settings.json"), c.cluster, val_lmdb=val_lmdb)  # fmt: skip
    if run["status"] != "ok":
        raise RuntimeError(f"vision point: {run['status']} (exit {run['returncode']}; see {log})")
    parsed = parse_vision_log(log)
    m = vision_run_metrics(parsed.batches, parsed.epochs,
                           measured_epoch=point["measured_epoch"], gpus=1)  # fmt: skip
    epoch = next((e for e in parsed.epochs if e.get("epoch") == m["measured_epoch"]), {})
    energy = m.get("energy_j", math.nan)
    per_image = energy / epoch["images"] if epoch.get("images") and energy else math.nan
    return {"images/s": m["images_per_s"], "J/image": per_image}


def step_canary(c: Check, kind: str) -> dict[str, float]:
    """The canary of ``kind`` (preflight.canary) scaled down from this check's own job."""
    folder = c.work / "canary" / kind
    record = folder.with_suffix(".json")
    key = canary.canary_key(c.cluster, kind, None, {"kind": kind})
    if kind.startswith("train_"):
        engine = kind.removeprefix("train_")
        raw = canary.train_canary_experiment(experiment(c, engine), c.cluster)
        prepared = prepare_experiment(f"canary_{kind}", raw, text_section(c), c.cluster)
        canary.run_train_canary(kind, prepared, folder, record, c.cluster, key)
    elif kind.startswith("language_"):
        point = canary.language_canary_point(bench_points(c)["language"], c.cluster)
        canary.run_language_canary(kind, point, folder, record, c.cluster, key)
    else:
        point = canary.vision_canary_point(bench_points(c)["vision"], c.cluster)
        train_lmdb, val_lmdb = images(c)
        canary.run_vision_canary(kind, point, train_lmdb, val_lmdb, folder, record,
                                 c.cluster, key)  # fmt: skip
    return {}


def needs_megatron(c: Check) -> None:
    if not c.megatron:
        raise Skip("no Megatron-LM tree: give --megatron PATH (or MEGATRON_LM_DIR)")
    problem = megatron_args.checkout_problem(c.megatron)  # as a plan checks megatron_lm
    if problem:
        raise RuntimeError(problem)
    if c.device != "cuda":
        raise Skip("no GPU: Megatron-LM's training loop asserts CUDA at start-up")


def steps(c: Check) -> list[tuple[str, Callable[[], Outcome]]]:
    """The steps in the order they run: what matters most first, so a time budget that
    runs out leaves the later canaries as SKIP rows."""

    def megatron(call: Callable[[], Outcome]) -> Callable[[], Outcome]:
        def run() -> Outcome:
            needs_megatron(c)
            return call()

        return run

    def language(call: Callable[[], Outcome]) -> Callable[[], Outcome]:
        """The language point and its canary: on Megatron where it runs, else torch."""

        def run() -> Outcome:
            if c.runs_megatron:
                needs_megatron(c)
            return call()

        return run

    engine = "megatron" if c.runs_megatron else "torch"
    return [
        ("probe", lambda: step_probe(c)),
        ("data", lambda: step_data(c)),
        ("train_torch", lambda: train(c, "torch")),
        ("export_torch", lambda: export_and_compare(c, "torch")),
        ("train_megatron", megatron(lambda: train(c, "megatron"))),
        ("export_megatron", megatron(lambda: export_and_compare(c, "megatron"))),
        ("bench_language", language(lambda: step_bench_language(c))),
        ("bench_vision", lambda: step_bench_vision(c)),
        ("canary_train_torch", lambda: step_canary(c, "train_torch")),
        (f"canary_language_{engine}", language(lambda: step_canary(c, f"language_{engine}"))),
        ("canary_vision", lambda: step_canary(c, "vision")),
        ("canary_train_megatron", megatron(lambda: step_canary(c, "train_megatron"))),
    ]


# --- running and reporting -------------------------------------------------------------------


def one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()  # the first line: the reason, not the traceback
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def run_steps(c: Check, chosen: list[tuple[str, Callable]], deadline: float) -> list[Row]:
    rows = []
    for name, call in chosen:
        if time.time() > deadline:
            rows.append(Row(name, "SKIP", detail="the time budget (--budget-s) was spent"))
            continue
        print(f"gpu-check: {name} ...", flush=True)
        start = time.time()
        try:
            outcome = call() or {}
            figures, detail = outcome if isinstance(outcome, tuple) else (outcome, "")
            rows.append(Row(name, "PASS", detail=detail, figures=figures))
        except Skip as e:
            rows.append(Row(name, "SKIP", detail=str(e)))
        except Exception as e:  # noqa: BLE001  (a failed step is a row; the others run)
            rows.append(Row(name, "FAIL", detail=one_line(e)))
        rows[-1].seconds = round(time.time() - start, 1)
        print(f"gpu-check: {name} {rows[-1].result} {rows[-1].detail}", flush=True)
    return rows


def _cell(value: float | None, column: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if column == "MFU":
        return f"{100 * value:.1f}%"
    if column in ("J/token", "J/image"):
        return f"{value:.3g}"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def table(rows: list[Row]) -> str:
    lines = [[r.step, r.result, f"{r.seconds:.0f}",
              *(_cell(r.figures.get(col), col) for col in COLUMNS[3:-1]), r.detail]
             for r in rows]  # fmt: skip
    widths = [max(len(str(x)) for x in col) for col in zip(COLUMNS, *lines)]
    widths[-1] = 0
    fmt = lambda cells: "  ".join(str(x).ljust(w) for x, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(COLUMNS), *map(fmt, lines)]) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hpcllm gpu-check",
        description="make gpu-check: the whole GPU path on this machine (both engines' "
        "save and resume, the export, a language and a vision point, the canaries, the "
        "site probe's checks) in minutes, one table at the end (docs/gpu-check.md).",
    )
    p.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="auto: the GPU where torch sees one, else the CPU at a tiny size",
    )
    p.add_argument(
        "--megatron",
        default=os.environ.get("MEGATRON_LM_DIR"),
        help="a Megatron-LM tree at the pin (default: $MEGATRON_LM_DIR)",
    )
    p.add_argument(
        "--out",
        default="gpu-check",
        help="folder for table.txt and figures.json (default: gpu-check)",
    )
    p.add_argument("--work", help="working folder (default: OUT/work; emptied first)")
    p.add_argument("--only", nargs="*", default=None, help="run these steps only")
    p.add_argument("--skip", nargs="*", default=[], help="leave these steps out")
    p.add_argument(
        "--budget-s",
        type=float,
        default=330.0,
        help="steps not started after this many seconds are SKIP rows",
    )
    return p  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import shutil

    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    out = Path(args.out).resolve()
    work = Path(args.work).resolve() if args.work else out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out.mkdir(parents=True, exist_ok=True)
    # The steps' own log lines (segments, exports, canaries) for a FAIL row's details.
    logging.basicConfig(filename=out / "gpu-check.log", level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    megatron = str(Path(args.megatron).resolve()) if args.megatron else None
    # The engines' `python`, torchrun and the jobs' own lookups find this Python first.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.time()
    here = os.getcwd()
    os.chdir(work)  # relative data paths, as in a workflow's working directory
    try:
        c = Check(device, this_machine(device, megatron), work, megatron, SIZES[device])
        chosen = [(n, f) for n, f in steps(c)
                  if (args.only is None or n in args.only) and n not in args.skip]  # fmt: skip
        rows = run_steps(c, chosen, started + args.budget_s)
    finally:
        os.chdir(here)
    gpu = c.cluster.gpu.model if c.cluster.gpu else "none"
    head = (f"hpcllm gpu-check on {os.uname().nodename}: device {device} ({gpu}), torch "
            f"{torch.__version__}, Megatron-LM {megatron or 'none'}, "
            f"{time.time() - started:.0f} s\n")  # fmt: skip
    text = head + table(rows)
    print(text, end="", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.txt").write_text(text)
    figures = {"device": device, "gpu": gpu, "torch": torch.__version__,
               "megatron": megatron, "seconds": round(time.time() - started, 1),
               "size": c.size, "steps": [dataclasses.asdict(r) for r in rows],
               "probe": c.made.get("probe")}  # fmt: skip
    (out / "figures.json").write_text(json.dumps(figures, indent=1, default=str) + "\n")
    return 1 if any(r.result == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
