"""A training segment's job on its cluster, at plan time: its time limit from its work, and
what is refused (ranks over GPUs, nodes over the partition, a signal or margin longer than
the time limit, a $NAME in a tokenizer path) or warned about (idle GPUs, billed)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from hpcllm.clusters import load_cluster
from hpcllm.models.planner import PlanError, pad_vocab
from hpcllm.training.plan.experiment import prepare_experiment
from hpcllm.training.plan.job_plan import segment_job

REPO = Path(__file__).resolve().parents[2]
TEXT = {
    "sources": {"fineweb": {"type": "local"}},
    "tokenizers": {"bpe": {"type": "train", "vocab_size": 50257}},
    "tokenize": {"tokenizers": ["bpe"]},
}
SCHEMA_TIME = {"limit_minutes": None, "margin_seconds": 900, "signal_seconds": 600}


def opengptx(**layout) -> dict:
    raw = yaml.safe_load((REPO / "config/experiments/opengptx_800m.yaml").read_text())
    exp = copy.deepcopy(raw["training"]["experiments"]["opengptx_800m"])
    exp["data"]["tokenizer"] = "bpe"
    exp["time"] = {**SCHEMA_TIME, **exp["time"]}
    exp["layout"].update(layout)
    return exp


def prepared_on(cluster: str, exp: dict, text: dict = TEXT):
    c = load_cluster(cluster, REPO / "config/clusters", environ={"HPCLLM_SCRATCH": "/s"})
    return c, prepare_experiment("opengptx_800m", exp, text, c)


def job(cluster: str, exp: dict, text: dict = TEXT):
    c, prepared = prepared_on(cluster, exp, text)
    tok = text["tokenizers"][exp["data"]["tokenizer"]]
    return segment_job("opengptx_800m", prepared, c, 50257, tok)


def test_segment_time_limit_is_sized_from_its_work_not_24_hours():
    """3000 iterations of the 800M model (global batch 512) on 16 A100s: ~2.7 h of work at
    the assumed 125 TFLOP/s; the limit adds the margin and start-up, well under 24 h."""
    planned = job("juwels", opengptx())
    assert planned.work.work_minutes == pytest.approx(164, abs=3)
    assert planned.limit_minutes == planned.work.limit_minutes
    assert 1.5 * 164 <= planned.limit_minutes <= 300
    assert planned.warnings == ()
    # the experiment's own time.limit_minutes wins (at most the partition's 24 h)
    exp = opengptx()
    exp["time"]["limit_minutes"] = 600
    assert job("juwels", exp).limit_minutes == 600
    exp["time"]["limit_minutes"] = 1500
    with pytest.raises(PlanError, match=r"time.limit_minutes: 1500 min, more than the 1440"):
        job("juwels", exp)


def test_more_work_than_the_partition_allows_is_clamped_and_said():
    exp = opengptx()
    exp["iterations_per_segment"] = 30000
    planned = job("juwels", exp)
    assert planned.limit_minutes == 1440
    assert any("needs more than the 1440 min juwels allows" in w for w in planned.warnings)


def test_ranks_below_the_gpus_of_a_whole_node_warn_with_the_billed_hours_wasted():
    """opengptx_800m with 4 ranks per node on LUMI's 8-GCD nodes."""
    planned = job("lumi", opengptx(procs_per_node=4))
    (warning,) = [w for w in planned.warnings if "procs_per_node" in w]
    # LUMI bills an MI250X module (2 GCDs) as its GPU-hour: 4 idle GCDs are 2 GPU-hours
    idle = 10 * 4 * 4 / 2 * planned.limit_minutes / 60
    assert "training.experiments.opengptx_800m.layout.procs_per_node: 4 ranks" in warning
    assert "lumi's whole nodes of 8 GPUs" in warning
    assert f"{idle:,.1f} billed GPU-hours wasted" in warning
    assert "Set procs_per_node to 8" in warning


def test_ranks_above_the_gpus_of_a_node_are_refused():
    with pytest.raises(
        PlanError,
        match=r"procs_per_node: 8 ranks per node, but a juwels node "
        r"has 4 GPUs .*juwels.yaml: gpus_per_node",
    ):
        job("juwels", opengptx(procs_per_node=8, nodes=2))


def test_more_nodes_than_the_partition_has_are_refused():
    with pytest.raises(
        PlanError,
        match=r"layout.nodes: 1024 nodes, but juwels's GPU partition "
        r"has 936 .*gpu_partition.nodes",
    ):
        job("juwels", opengptx(nodes=1024))


@pytest.mark.parametrize("key", ["signal_seconds", "margin_seconds"])
def test_signal_or_margin_not_shorter_than_the_time_limit_is_refused(key):
    exp = opengptx()
    exp["time"]["limit_minutes"] = 30
    exp["time"][key] = 1800
    with pytest.raises(
        PlanError,
        match=rf"time.{key}: 1800 s is not shorter than the "
        r"segment's time limit of 30 min \(1800 s\)",
    ):
        job("juwels", exp)
    exp["time"][key] = 1799
    assert job("juwels", exp).limit_minutes == 30


def test_environment_variable_in_a_tokenizer_path_is_refused():
    text = copy.deepcopy(TEXT)
    text["tokenizers"]["bpe"] = {
        "type": "files",
        "vocab_file": "$SCRATCH/gpt2/vocab.json",
        "merges_file": "/p/gpt2/merges.txt",
    }
    with pytest.raises(
        PlanError,
        match=r"text.tokenizers.bpe.vocab_file: '\$SCRATCH/gpt2/"
        r"vocab.json' names the environment variable \$SCRATCH",
    ):
        job("juwels", opengptx(), text)


def test_memory_on_lumi_counts_activations_without_sequence_parallelism():
    """LUMI's image has no Transformer Engine, so Megatron runs there without sequence
    parallelism (megatron_args.py): the activations are not split over TP, and the plan
    must count them so (an estimate below what runs would let an OOM through)."""
    exp = opengptx(tp=2, sequence_parallel=True, nodes=4)
    lumi = load_cluster("lumi", REPO / "config/clusters", environ={"HPCLLM_SCRATCH": "/s"})
    on_lumi = prepare_experiment("opengptx_800m", copy.deepcopy(exp), TEXT, lumi)
    without = copy.deepcopy(exp)
    without["layout"]["sequence_parallel"] = False
    on_lumi_off = prepare_experiment("opengptx_800m", without, TEXT, lumi)
    assert on_lumi.memory_gb == pytest.approx(on_lumi_off.memory_gb)
    # the experiment itself still asks for it (tracked setting; other sites use it)
    assert on_lumi.experiment["layout"]["sequence_parallel"] is True
    juwels = load_cluster("juwels", REPO / "config/clusters", environ={"HPCLLM_SCRATCH": "/s"})
    on_juwels = prepare_experiment("opengptx_800m", copy.deepcopy(exp), TEXT, juwels)
    assert on_juwels.memory_gb < on_lumi.memory_gb


def test_megatron_memory_is_planned_as_it_runs_without_transformer_engine():
    """opengptx_800m (TP 2, micro batch 4) asks for sequence parallelism and flash
    attention; LUMI's Megatron has neither (--transformer-impl local): per layer then
    s*b*h*(10 + 24/TP) + 5*a*s^2*b/TP bytes, 11.3 GB over 16 layers, not the 4.6 GB of
    34*s*b*h/TP. The plan says what is dropped and counts what runs."""
    s, b, h, a, tp = 2048, 4, 2048, 8, 2
    logits = 4 * s * b * pad_vocab(50257, tp) / tp / 1e9
    on_lumi = job("lumi", opengptx(procs_per_node=8))
    assert on_lumi.memory.activations - logits == pytest.approx(
        16 * (s * b * h * (10 + 24 / tp) + 5 * a * s * s * b / tp) / 1e9
    )
    assert on_lumi.memory.activations - logits == pytest.approx(11.3, abs=0.05)
    (dropped,) = [w for w in on_lumi.warnings if "Transformer Engine" in w]
    assert (
        "asks for sequence parallelism and flash attention and the distributed optimizer, but "
        "Megatron-LM runs on lumi without Transformer Engine (--transformer-impl local: the "
        "amd training image has no Transformer Engine ("
    ) in dropped
    assert f"planned at {on_lumi.memory.describe()}" in dropped
    on_juwels = job("juwels", opengptx())
    assert on_juwels.memory.activations - logits == pytest.approx(16 * 34 * s * b * h / tp / 1e9)
    assert on_juwels.warnings == ()


def test_a_campaign_without_a_fused_adam_runs_without_the_distributed_optimizer():
    """Where Megatron has no fused Adam (no Transformer Engine, no Apex: LUMI's image), a
    distributed-optimizer campaign died at its first resume (Megatron's torch-AdamW
    fallback: test_distributed_optimizer.py). The plan drops it, says so and why, counts
    the optimizer state each rank then holds whole (DP 16: 16 times its share), and
    suggests no distributed optimizer; the job's command line has none. A benchmark point
    resumes nothing and keeps it."""
    from hpcllm.models.megatron_args import as_run, transformer_impl_for
    from hpcllm.models.planner import estimate_memory
    from hpcllm.training.engines.command import engine_command
    from hpcllm.training.plan.experiment import Paths

    exp = opengptx(procs_per_node=8)
    on_lumi = job("lumi", exp)
    (dropped,) = [w for w in on_lumi.warnings if "distributed optimizer" in w]
    assert dropped.endswith(
        "(the distributed optimizer needs a fused Adam, Transformer Engine's or Apex's, to "
        "resume from a checkpoint)"
    )
    lumi, prepared = prepared_on("lumi", exp)
    paths = Paths("ck", "seg1.json", "seg1.engine.log", "ck/cache", "ck/tb")
    command = engine_command(
        prepared.experiment, prepared.layout, prepared.blend, prepared.tokenizer_files,
        paths, 1, None, transformer_impl=transformer_impl_for(lumi),
    )  # fmt: skip
    assert "--use-distributed-optimizer" not in command and "--save" in command
    resolved = prepared.experiment
    assert as_run(resolved, "local")[0]["layout"]["distributed_optimizer"] is True
    assert as_run(resolved, "local", resumes=True)[0]["layout"]["distributed_optimizer"] is False
    sharded = estimate_memory(as_run(resolved, "local")[0], prepared.layout, 50257).optimizer
    assert prepared.layout.dp == 16
    assert on_lumi.memory.optimizer == pytest.approx(16 * sharded)


def test_a_layout_that_fits_only_with_transformer_engine_is_refused_without_it():
    """Micro batch 32 on LUMI: about 46 GB per GCD with sequence parallelism and flash
    attention (under 90% of 64), about 105 GB as Megatron runs it there (also without the
    distributed optimizer); the advice does not suggest it."""
    from hpcllm.models.planner import check_layout, estimate_memory
    from hpcllm.models.presets import resolve_experiment

    exp = opengptx(procs_per_node=8)
    exp["batch"] = {"micro": 32, "global": 512}
    resolved = resolve_experiment("x", copy.deepcopy(exp))
    asked = estimate_memory(resolved, check_layout("x", resolved, 32), 50257)
    assert asked.total < 0.9 * 64
    with pytest.raises(
        PlanError, match=r"opengptx_800m: TP=2 PP=1 DP=16 needs about 105.0 GB"
    ) as e:
        job("lumi", exp)
    assert "distributed_optimizer: true" not in str(e.value)


@pytest.mark.parametrize("cluster", ["lumi", "karolina", "juwels"])
def test_the_shipped_experiment_uses_every_gpu_of_the_sites_nodes(cluster):
    """config/experiments/opengptx_800m.yaml takes its ranks per node from the site (it
    ran 4 ranks on LUMI's and Karolina's 8-GPU nodes: about 1,120 and 650 billed
    GPU-hours idle)."""
    c = load_cluster(cluster, REPO / "config/clusters", environ={"HPCLLM_SCRATCH": "/s"})
    planned = job(cluster, opengptx())
    assert not [w for w in planned.warnings if "procs_per_node" in w]
    prepared = prepare_experiment("opengptx_800m", opengptx(), TEXT, c)
    assert prepared.experiment["layout"]["procs_per_node"] == c.gpus_per_node
    assert prepared.layout.gpus == 4 * c.gpus_per_node
