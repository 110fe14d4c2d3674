"""The cost line of a plan: node-hours and GPU-hours per rule, and the limit."""

import pytest

from hpcllm.plan_cost import Job, cost_per_rule, describe, over_limit, runtime_minutes


def test_cost_per_rule_from_nodes_and_time_limits():
    jobs = [Job("train_segment", 4, 1440)] * 10 + [Job("bench_language", 32, 60)] * 2
    costs = {c.rule: c for c in cost_per_rule(jobs, gpus_per_node=4)}
    assert costs["train_segment"].jobs == 10 and costs["train_segment"].node_hours == 960
    assert costs["train_segment"].gpu_hours == 3840
    assert costs["bench_language"].node_hours == 64 and costs["bench_language"].gpu_hours == 256
    lines = describe(list(costs.values()), "juwels")
    assert lines[-1] == "  total: 1,024.0 node-hours, 4,096.0 GPU-hours"
    assert "no GPU jobs" in describe([], "juwels")[0]
    # LUMI's nodes count 8 GPUs (GCDs): the same node-hours are twice the GPU-hours
    lumi = {c.rule: c for c in cost_per_rule(jobs, gpus_per_node=8)}
    assert lumi["train_segment"].node_hours == 960 and lumi["train_segment"].gpu_hours == 7680


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
