"""The cost line of a plan: node-hours and GPU-hours per rule, and the limit."""

import math

import pytest

from hpcllm.cpu_limits import cpu_job_minutes, export_minutes, index_cache_minutes
from hpcllm.plan_cost import (
    HangRisk,
    Job,
    TrainingEstimate,
    cost_per_rule,
    describe,
    describe_cpu_only,
    describe_hang_risk,
    measured_tflops,
    over_limit,
    runtime_minutes,
)
from hpcllm.work_time import flops_per_iteration, time_limit


def test_cost_per_rule_from_nodes_and_time_limits():
    jobs = [Job("train_segment", 4, 1440)] * 10 + [Job("bench_language", 32, 60)] * 2
    costs = {c.rule: c for c in cost_per_rule(jobs, gpus_per_node=4)}
    assert costs["train_segment"].jobs == 10 and costs["train_segment"].node_hours == 960
    assert costs["train_segment"].gpu_hours == 3840
    assert costs["bench_language"].node_hours == 64 and costs["bench_language"].gpu_hours == 256
    lines = describe(list(costs.values()), "juwels")
    assert lines[-1] == "  total: 1,024.0 node-hours, 4,096.0 GPU-hours"
    assert "no jobs that hold GPU nodes" in describe([], "juwels")[0]
    # 8 GPUs a node: the same node-hours are twice the GPU-hours (Karolina)
    eight = {c.rule: c for c in cost_per_rule(jobs, gpus_per_node=8)}
    assert eight["train_segment"].node_hours == 960 and eight["train_segment"].gpu_hours == 7680


def test_over_the_limit_names_the_key_and_the_value_that_would_do():
    costs = cost_per_rule([Job("train_segment", 4, 1440)] * 10, gpus_per_node=4)
    message = over_limit(costs, 500, "juwels")
    assert "3,840.0 GPU-hours, more than max_gpu_hours = 500" in message
    # a --config replaces the profile's (cluster: juwels), so the way out names it again
    assert "--config cluster=juwels max_gpu_hours=3841" in message
    assert over_limit(costs, 3840, "juwels") is None


@pytest.mark.parametrize(
    ("value", "minutes"), [(90, 90), ("90", 90), ("2h", 120), ("30m", 30), ("1d", 1440)]
)
def test_runtime_in_minutes(value, minutes):
    assert runtime_minutes(value) == minutes


def test_unreadable_runtime_is_refused():
    with pytest.raises(ValueError, match="runtime 'soon'"):
        runtime_minutes("soon")


def test_cpu_jobs_on_whole_gpu_nodes_are_priced():
    """A 240-shard plan on JUWELS (no CPU partition: every job holds a Booster node):
    tokenize in batches of 12 shards (one node each), a merge, a tokenizer, the index
    cache; not 0 hours."""
    jobs = (
        [Job("tokenize_batch", 1, 60)] * 20
        + [Job("merge_tokenized", 1, 60), Job("train_tokenizer", 1, 120)]
        + [Job("prepare_data_cache", 1, 120)]
    )
    costs = {c.rule: c for c in cost_per_rule(jobs, gpus_per_node=4)}
    assert costs["tokenize_batch"].jobs == 20 and costs["tokenize_batch"].node_hours == 20
    assert costs["tokenize_batch"].gpu_hours == 80
    assert costs["train_tokenizer"].gpu_hours == 8
    lines = describe(list(costs.values()), "juwels")
    assert lines[-1] == "  total: 25.0 node-hours, 100.0 GPU-hours"


def test_cpu_only_work_on_gpu_nodes_is_said_with_its_share_and_why():
    cpu = cost_per_rule([Job("prepare_data_cache", 1, 36), Job("export_model", 1, 17)], 4)
    gpu = cost_per_rule([Job("train_segment", 4, 1060)], 4)
    lines = describe_cpu_only(cpu, cpu + gpu, "juwels", "no CPU budget (JSC, https://x)")
    assert lines == [
        "CPU-only jobs on GPU nodes on juwels: export_model, prepare_data_cache: 3.5 of the "
        "286.2 GPU-hours, each for its time limit (prepare_data_cache's and export_model's "
        "sized from their work). Why: no CPU budget (JSC, https://x)"
    ]
    assert describe_cpu_only([], gpu, "lumi", None) == []


def test_cpu_job_limits_sized_from_the_work_where_they_hold_gpu_nodes():
    """The 800M campaign (10 x 3000 iterations x 512 samples; 0.9B parameters) on a
    whole-node site: limits from the measured rates with their margin, not 2 h each; on
    a CPU partition the 2 h stay, and a 175B export gets the hours it needs anywhere."""
    samples = 10 * 3000 * 512
    assert index_cache_minutes(samples) == 10 + math.ceil(10 * samples / (965_848 / 8.6) / 60)
    assert 30 <= index_cache_minutes(samples) <= 40
    assert 15 <= export_minutes(900_000_000) <= 20
    assert cpu_job_minutes(120, 36, whole_nodes=True, max_minutes=1440) == 36
    assert cpu_job_minutes(120, 36, whole_nodes=False, max_minutes=1440) == 120
    big = export_minutes(175_000_000_000)
    assert big > 120 and cpu_job_minutes(120, big, False, 1440) == big
    assert cpu_job_minutes(120, big, True, 240) == 240  # at most the site's longest


def test_time_limit_from_work_gpt3_175b_on_16_lumi_nodes():
    """EPICURE's strong-scaling baseline: GPT-3 175B, global batch 1536, 20 iterations on
    16 LUMI nodes (128 GCDs): about 88 min at 100 TFLOP/s per GCD, so 60 min cannot do."""
    model = {"num_layers": 96, "hidden_size": 12288, "seq_length": 2048}
    flops = 20 * flops_per_iteration(model, 1536, 50304)
    at_100 = time_limit(flops, 128, 100, max_minutes=2880)
    assert at_100.work_minutes == pytest.approx(88, abs=1.5)
    assert at_100.limit_minutes >= 1.5 * 88 and not at_100.clamped
    # longer than the partition allows: clamped and said
    short = time_limit(flops, 128, 100, max_minutes=60)
    assert short.limit_minutes == 60 and short.clamped


def test_measured_rate_from_the_users_benchmark_summary(tmp_path):
    summary = tmp_path / "summary.csv"
    summary.write_text(
        "benchmark,cluster,preset,precision,status,tflops_per_gpu\n"
        "language,juwels,gpt3_860m,bf16,ok,100\n"
        "language,juwels,gpt3_860m,bf16,ok,120\n"
        "language,juwels,gpt3_860m,bf16,time_limit,10\n"
        "language,lumi,gpt3_860m,bf16,ok,50\n"
    )
    rate, source = measured_tflops(summary, "juwels", "gpt3_860m", "bf16")
    assert rate == 110 and "median of 2 run(s) of gpt3_860m" in source
    assert measured_tflops(summary, "juwels", "gpt3_175b", "bf16") is None
    assert measured_tflops(tmp_path / "none.csv", "juwels", "gpt3_860m", "bf16") is None
    estimate = TrainingEstimate("e", 1e9, 3.6e18, 10, 100, "assumed", 50)
    assert estimate.hours == pytest.approx(1.0)
    assert "about 1.0 h on 10 GPUs at 100 TFLOP/s per GPU (assumed)" in estimate.describe()


def test_the_plan_prices_a_hang_with_and_without_the_watchdog(tmp_path):
    """Nodes x the watchdog's bound against nodes x the time limit, in GPU-hours; the
    bound from the experiment's measured times (hpcllm.training.campaign.watchdog)."""
    from hpcllm.clusters import WatchdogFacts
    from hpcllm.training.campaign.watchdog import segment_bounds

    exp = {"engine": "megatron", "log_interval": 10, "eval_iters": 10}
    save = tmp_path / "checkpoints"
    before = segment_bounds(exp, WatchdogFacts(), save)  # nothing measured: the ceiling
    (save / "chain").mkdir(parents=True)
    (save / "chain" / "seg1.json").write_text('{"iteration_seconds": 30, "save_seconds": 90}')
    after = segment_bounds(exp, WatchdogFacts(), save)  # 4 x (10 + 10) x 30 s: 40 min
    risks = [
        HangRisk("bench_language", 32, 60),
        HangRisk("train_segment x", 4, 265, before.step / 60, before.start / 60,
                 before.reason["step"]),
        HangRisk("train_segment y", 256, 1440, after.step / 60,
                 max(after.start, after.save) / 60, after.reason["step"]),
    ]  # fmt: skip
    lines = describe_hang_risk(risks, "juwels", gpus_per_node=4)
    assert lines[0].startswith("What a hang costs on juwels")
    assert lines[1] == (
        "  bench_language: no watchdog: a hang costs 128.0 GPU-hours (32 nodes x the time "
        "limit, 60 min)"
    )
    # the 800M example: 4 nodes, 265 min, nothing measured: the 60-minute ceiling
    assert lines[2] == (
        "  train_segment x: a hang costs 16.0 GPU-hours with the watchdog (4 nodes x its "
        "bound of 60 min: the ceiling, as nothing was measured yet); 70.7 GPU-hours "
        "without it (4 nodes x the time limit, 265 min)"
    )
    # 256 nodes, measured: 40 minutes while training (from Megatron-LM's log: a log
    # interval of 10 iterations and an evaluation of 10), the ceiling in a start-up
    assert lines[3].startswith(
        "  train_segment y: a hang costs 682.7 GPU-hours with the watchdog (256 nodes x its "
        "bound of 40 min: 4 x 20 iterations of 30 s measured in segment 1"
    )
    assert lines[3].endswith(
        ", up to 1,024.0 in a start-up or a save not measured yet (60 min); 24,576.0 "
        "GPU-hours without it (256 nodes x the time limit, 1,440 min)"
    )
    assert describe_hang_risk([], "juwels", 4) == []
    # a bound above the time limit holds the nodes no longer than the limit
    short = HangRisk("train_segment z", 2, 30, 60, 60, "the ceiling")
    assert "a hang costs 4.0 GPU-hours with the watchdog" in short.describe(4)


def test_the_docs_quote_what_the_hang_cost_benchmark_prints_for_juwels(monkeypatch, capsys):
    """docs/training.md's GPU-hours per hang for the 800M example and the 256-node segment
    are benchmarks/hang_cost.py's output (the plan's own functions), not written by hand:
    its table verbatim, and the figures the text names."""
    import importlib.util
    import sys

    from support import REPO

    spec = importlib.util.spec_from_file_location("hang_cost", REPO / "benchmarks" / "hang_cost.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "hang_cost", module)  # (its dataclass looks it up)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["hang_cost.py", "--cluster", "juwels"])
    module.main()
    printed = capsys.readouterr().out
    docs = (REPO / "docs" / "training.md").read_text()
    assert printed in docs, printed
    example, big = module.costs("juwels")[0]
    # nodes x GPUs per node x (time limit - bound): the saving per event
    for c in (example, big):
        assert c.saved[1] == pytest.approx(
            c.nodes * c.gpus_per_node * (c.limit_min - c.measured_min) / 60
        )
    assert (example.nodes, example.limit_min, big.nodes) == (4, 265, 256)
    text = " ".join(docs.split())
    assert (
        f"a hang costs {example.without:,.1f} GPU-hours without the watchdog and "
        f"{example.with_ceiling:,.1f} with it before anything is measured, "
        f"{example.with_measured:,.1f} once segment 1 measured its iterations: "
        f"{example.saved[0]:,.1f} to {example.saved[1]:,.1f} GPU-hours saved per event"
    ) in text
    assert (
        f"a hang costs {big.without:,.1f} GPU-hours without the watchdog, "
        f"{big.with_ceiling:,.1f} and {big.with_measured:,.1f} with it: "
        f"{big.saved[0]:,.1f} to {big.saved[1]:,.1f} GPU-hours saved per event"
    ) in text
