import sys
from pathlib import Path

import pytest
import yaml
from support import megatron_checkout

from hpcllm.bench.sweeps import (
    ClusterFacts,
    SweepError,
    expand_all,
    expand_experiment,
    facts_of,
    node_counts,
    point_time_limit,
)
from hpcllm.clusters import load_cluster

REPO = Path(__file__).resolve().parents[2]
SCHEMA = yaml.safe_load((REPO / "workflow/schemas/benchmarks.schema.yaml").read_text())
JUWELS = ClusterFacts("juwels", 4, 40.0, {"bf16": 312.0, "fp32": 19.5}, "A100")


def language(**over):
    exp = yaml.safe_load((REPO / "config/experiments/language.yaml").read_text())
    exp.update(over)
    return exp


def test_node_counts_double_from_the_minimum():
    assert node_counts(32, 256) == [32, 64, 128, 256]
    assert node_counts(1, 1) == [1]
    assert node_counts(4, 3) == []


A100_80GB = ClusterFacts("juwels", 4, 80.0, {"bf16": 312.0, "fp32": 19.5}, "A100")


def test_gpt3_175b_on_juwels_tp_in_node_pp_across_nodes():
    # 80 GB GPUs, so that every node count fits (the 40 GB case is the next test)
    points = [p for p in expand_experiment("lang", language(), A100_80GB) if p.model == "gpt3_175b"]
    assert sorted({p.nodes for p in points}) == [32, 64, 128, 256]
    strong = {p.nodes: p.settings for p in points if p.scaling == "strong"}
    weak = {p.nodes: p.settings for p in points if p.scaling == "weak"}
    assert strong[32]["tp"] == 4 and strong[32]["pp"] == 32 and strong[32]["dp"] == 1
    assert strong[256]["dp"] == 8 and strong[256]["global_batch"] == 1536
    assert strong[256]["grad_accum"] == 1536 // 8
    assert weak[64]["global_batch"] == 192 * 2 and weak[64]["grad_accum"] == 192
    assert strong[32]["sequence_parallel"] and strong[32]["distributed_optimizer"]
    assert points[0].peak_tflops == 312.0  # dense bf16, not the sparsity figure


def test_points_that_cannot_fit_are_left_out_with_a_message():
    # GPT-3 175B on 32 nodes of 40 GB A100s: PP 32, DP 1 needs ~48 GB per GPU (the
    # optimizer is not sharded with one replica); at 64 nodes DP 2 still ~38.9 GB (bf16
    # keeps fp32 main gradients), more than 90% of 40.
    dropped: list[str] = []
    points = expand_experiment("lang", language(), JUWELS, dropped)
    nodes = sorted({p.nodes for p in points if p.model == "gpt3_175b"})
    assert nodes == [128, 256]
    assert len(dropped) == 4  # strong and weak at 32 and 64 nodes
    assert all("gpt3_175b" in m and "40 GB" in m for m in dropped)
    assert sum("n0064" in m and "38.9 GB" in m for m in dropped) == 2
    assert "training.experiments" not in dropped[0]  # the point's id, not a training key
    # without a list to report to, the points are still left out
    assert {p.id for p in expand_experiment("lang", language(), JUWELS)} == {p.id for p in points}


def test_baseline_is_the_smallest_node_count_even_when_it_failed(tmp_path):
    from test_summary_plots import point, put_run, scaled_log

    from hpcllm.bench.summary import summarize

    results = tmp_path / "results"
    points = [point(1), point(2), point(4)]
    put_run(results, points[0], (REPO / "tests/bench/data/megatron_oom.log").read_text())
    put_run(results, points[1], scaled_log(1.0))
    put_run(results, points[2], scaled_log(1.0))
    df = summarize(points, results).set_index("id")
    assert df.loc[points[0]["id"], "status"] == "out_of_memory"
    # not 1.0 and 0.5 against the 2-node point: no efficiency without the real baseline
    assert df["efficiency"].isna().all()
    assert (df["baseline_nodes"] == 1).all()


def test_small_model_one_gpu_per_replica():
    points = [p for p in expand_experiment("lang", language(), JUWELS) if p.model == "gpt3_860m"]
    assert sorted({p.nodes for p in points}) == [1, 2, 4, 8, 16, 32, 64, 128]
    p = next(p for p in points if p.nodes == 128 and p.scaling == "strong")
    assert (p.settings["tp"], p.settings["pp"], p.settings["dp"]) == (1, 1, 512)
    assert not p.settings["sequence_parallel"]  # only with TP > 1


def test_batch_that_does_not_divide_is_refused_with_its_key():
    exp = language(max_nodes={"juwels": 256})
    exp["models"]["gpt3_860m"].pop("max_nodes")
    with pytest.raises(SweepError, match="gpt3_860m.*strong_global_batch 512.*256 nodes"):
        expand_experiment("lang", exp, JUWELS)


def test_clusters_not_named_get_no_points():
    assert expand_experiment("lang", language(), ClusterFacts("local", 0)) == []


def test_vision_batch_by_gpu_memory_and_epicure_weak_scaling():
    exp = yaml.safe_load((REPO / "config/experiments/vision.yaml").read_text())
    points = expand_experiment("vision", exp, JUWELS)
    assert {p.settings["batch_per_gpu"] for p in points} == {128}
    h100 = ClusterFacts("juwels", 4, 80.0)
    assert expand_experiment("vision", exp, h100)[0].settings["batch_per_gpu"] == 512
    assert (
        expand_experiment("vision", exp, ClusterFacts("juwels", 4, 64.0))[0].settings[
            "batch_per_gpu"
        ]
        == 256
    )
    # EPICURE's weak scaling: the per-GPU batch fixed, the global batch growing with the
    # GPUs, every point over the same dataset (no point repeats it to run as long as 1 node)
    assert {p.scaling for p in points} == {"weak"}
    assert all(p.settings["global_batch"] == 128 * p.gpus for p in points)
    assert {p.settings["repeat"] for p in points} == {1}
    assert {p.precision for p in points} == {"fp32", "amp"}
    assert len(points) == 7 * 2  # 1..64 nodes, two precisions
    # TinyImageNet's 13 reads per epoch stay 13 at every node count
    tiny = expand_experiment("vision", {**exp, "repeat": 13}, JUWELS)
    assert {p.settings["repeat"] for p in tiny} == {13}


def test_vision_refuses_a_strong_mode():
    exp = yaml.safe_load((REPO / "config/experiments/vision.yaml").read_text())
    with pytest.raises(SweepError, match="experiment vision: scaling 'strong'.*weak"):
        expand_experiment("vision", {**exp, "scaling": ["weak", "strong"]}, JUWELS)


def test_schema_errors_name_the_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("benchmark: vision\ndataset: x\nmax_nodes: {local: 2}\nprecision: [fp64]\n")
    with pytest.raises(SweepError, match=r"bad.yaml: key precision.0: 'fp64' is not one of"):
        expand_all({"bad": str(bad)}, ClusterFacts("local", 0), schema=SCHEMA)
    with pytest.raises(SweepError, match="does not exist"):
        expand_all({"gone": "nope.yaml"}, ClusterFacts("local", 0), root=tmp_path, schema=SCHEMA)


def test_full_juwels_sweeps_expand():
    # How fast this is belongs in a benchmark, not in a timed test.
    cluster = facts_of(load_cluster("juwels", root=REPO / "config/clusters"))
    points = expand_all(
        {
            "language": "config/experiments/language.yaml",
            "vision": "config/experiments/vision.yaml",
        },
        cluster,
        root=REPO,
        schema=SCHEMA,
    )
    assert len({p.id for p in points}) == len(points)
    # language: 175B at 128-256 nodes (64 needs ~38.9 GB of 40) and 860M at 1-128, strong
    # and weak; vision: 1-64 nodes, EPICURE's weak scaling only, FP32 and AMP
    assert len(points) == 2 * (2 + 8) + 7 * 2


def test_unknown_key_in_an_inline_experiment_is_named():
    from hpcllm.configuration import ConfigError, check_section

    config = yaml.safe_load((REPO / "config/examples/local.yaml").read_text())["benchmarks"]
    config["experiments"]["language_tiny"]["micro_batchh"] = 2
    with pytest.raises(ConfigError, match=r"language_tiny: .*'micro_batchh' was unexpected"):
        check_section("benchmarks", config, REPO / "workflow/schemas/benchmarks.schema.yaml")


def _bpe_tokenizer(path, words):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"])
    tok.train_from_iterator([" ".join(words)] * 50, trainer)
    tok.save(str(path))
    return tok


def test_benchmark_tokenizer_is_the_file_named_not_files_beside_it(tmp_path):
    import json

    from hpcllm.bench.language import engine_command

    folder = tmp_path / "tok"
    folder.mkdir()
    tok = _bpe_tokenizer(folder / "tokenizer.json", ["alpha", "beta", "gamma", "delta"])
    # a stale GPT-2 pair of another tokenizer beside it, which used to be taken instead
    other = _bpe_tokenizer(tmp_path / "other.json", ["zulu", "yankee", "xray"])
    other.model.save(str(folder))
    point = {
        **expand_experiment("lang", language(), A100_80GB)[0].row(),
        "data": str(tmp_path / "data_text_document"),
        "tokenizer": str(folder / "tokenizer.json"),
    }
    # the torch engine: a copy of the named tokenizer, never the GPT-2 pair beside it
    argv = engine_command({**point, "engine": "torch"}, tmp_path / "run", "python")
    assert "--vocab-file" not in argv
    model = Path(argv[argv.index("--tokenizer-model") + 1])
    assert str(model).startswith(str(tmp_path / "run"))
    copied = json.loads((model / "tokenizer.json").read_text())["model"]["vocab"]
    assert copied == tok.get_vocab() != other.get_vocab()
    # Megatron: the named file itself, read offline (HuggingFaceTokenizer on its copy)
    argv = engine_command(point, tmp_path / "run", "python")
    assert "--mock-data" not in argv and "--vocab-file" not in argv
    assert argv[argv.index("--tokenizer-type") + 1] == "HuggingFaceTokenizer"
    model = Path(argv[argv.index("--tokenizer-model") + 1])
    assert (model / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()


def test_megatron_benchmark_point_starts_without_files_warm_up_or_checkpoint(tmp_path):
    """What made every language point fail in Megatron's start-up: GPT2BPETokenizer with no
    vocabulary for mock data, the preset's warm-up (2000) longer than the 20 iterations,
    and a terabyte checkpoint written at the end (tests/training/test_megatron_conformance
    runs Megatron's own start-up checks on these command lines)."""
    from hpcllm.bench.language import engine_command

    point = next(
        p.row() for p in expand_experiment("lang", language(), A100_80GB) if p.model == "gpt3_175b"
    )
    argv = engine_command(point, tmp_path / "run", "python")
    value = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
    assert "--mock-data" in argv and value["--tokenizer-type"] == "NullTokenizer"
    assert int(value["--lr-warmup-iters"]) < int(value["--train-iters"]) == point["iterations"]
    assert "--save" not in argv and "--load" not in argv


def test_fp16_is_the_epicure_comparable_precision(tmp_path):
    """Issue 21: EPICURE's language benchmark ran fp16; a point of that precision runs
    Megatron's --fp16 with its dynamic loss scaling (no --loss-scale), the torch engine's
    --fp16, and counts against the half-precision peak."""
    from hpcllm.bench.language import engine_command

    points = expand_experiment("lang", language(precision=["fp16"]), JUWELS)
    point = next(p.row() for p in points if p.model == "gpt3_860m")
    assert point["id"].endswith(".fp16.n0001") and point["peak_tflops"] == 312.0
    argv = engine_command(point, tmp_path / "run", "python")
    assert "--fp16" in argv and "--bf16" not in argv
    assert not {"--loss-scale", "--initial-loss-scale"} & set(argv)
    torch_argv = engine_command({**point, "engine": "torch"}, tmp_path / "run", "python")
    assert "--fp16" in torch_argv and "--bf16" not in torch_argv


def test_karolina_gets_points_of_both_benchmarks():
    """EPICURE ran both benchmarks on Karolina (8 A100 per node); 16 nodes is the largest
    job of its qgpu queue (config/experiments/*.yaml say how to go further)."""
    karolina = facts_of(load_cluster("karolina", REPO / "config/clusters", environ={}))
    experiments = {
        "language": str(REPO / "config/experiments/language.yaml"),
        "vision": str(REPO / "config/experiments/vision.yaml"),
    }
    points = expand_all(experiments, karolina, schema=SCHEMA)
    nodes = {(p.benchmark, p.nodes) for p in points}
    for benchmark in ("language", "vision"):
        assert {n for b, n in nodes if b == benchmark} == {1, 2, 4, 8, 16}, nodes
    assert all(p.procs_per_node == 8 for p in points)


def test_time_limits_from_the_points_work_on_lumi():
    """GPT-3 175B strong scaling at 16 LUMI nodes (the baseline): ~88 min of work at 100
    TFLOP/s per GCD, longer at LUMI's assumed rate; never the old constant 60 min; the
    time shrinks as nodes double; the 860M points get short limits."""
    lumi = facts_of(load_cluster("lumi", REPO / "config/clusters", environ={}))
    points = {p.id: p for p in expand_experiment("lang", language(), lumi)}
    base = points["lang.gpt3_175b.strong.bf16.n0016"].row()
    work = point_time_limit(base, lumi)
    assert work.tflops_per_gpu == lumi.assumed_tflops["bf16"]
    at_100 = work.work_minutes * work.tflops_per_gpu / 100
    assert at_100 == pytest.approx(88, abs=1.5)
    assert work.limit_minutes >= 1.5 * work.work_minutes > 88
    assert work.limit_minutes <= lumi.max_minutes == 2880
    double = point_time_limit(points["lang.gpt3_175b.strong.bf16.n0032"].row(), lumi)
    assert double.work_minutes == pytest.approx(work.work_minutes / 2)
    small = point_time_limit(points["lang.gpt3_860m.strong.bf16.n0001"].row(), lumi)
    assert small.limit_minutes < 60


def test_points_without_transformer_engine_are_planned_as_they_run():
    """Megatron's local layers (LUMI's image) have no sequence parallelism and no flash
    attention: GPT-3 175B at 16, 32 and 64 nodes of 8 GPUs needs about 57, 49 and 44 GB
    per GPU so (36, 28 and 23 with both), more than 90% of 48 GB; the points say what
    runs."""
    peaks = {"bf16": 191.5, "fp32": 23.9}
    te = ClusterFacts("lumi", 8, 48.0, peaks, "GPU")
    local = ClusterFacts("lumi", 8, 48.0, peaks, "GPU", transformer_impl="local")
    nodes_of = lambda points: sorted({p.nodes for p in points if p.model == "gpt3_175b"})  # noqa: E731
    with_te = expand_experiment("lang", language(), te)
    assert nodes_of(with_te) == [16, 32, 64, 128]
    assert all(p.settings["sequence_parallel"] for p in with_te if p.model == "gpt3_175b")
    dropped: list[str] = []
    without = expand_experiment("lang", language(), local, dropped)
    assert nodes_of(without) == [128]
    assert not any(p.settings["sequence_parallel"] for p in without)
    assert (
        "sequence_parallel is true, but Megatron-LM runs on lumi without Transformer" in dropped[0]
    )
    assert sum("n0016" in m and "57.4 GB" in m for m in dropped) == 2
    lumi = facts_of(load_cluster("lumi", REPO / "config/clusters", environ={}))
    assert lumi.transformer_impl == "local"


def test_vision_time_limits_from_the_points_work():
    """5 ImageNet-1k epochs (and 5 validations) of ResNet-50 on one JUWELS node: 3 x 8.18
    GFLOP per training image, at half the assumed 125 TFLOP/s with AMP, a quarter in FP32
    (TF32); the time halves as nodes double, never a constant limit."""
    juwels = facts_of(load_cluster("juwels", REPO / "config/clusters", environ={}))
    vision = yaml.safe_load((REPO / "config/experiments/vision.yaml").read_text())
    points = {p.id: p.row() for p in expand_experiment("v", vision, juwels)}
    amp = point_time_limit(points["v.resnet50.weak.amp.n0001"], juwels)
    flops = 5 * (1_281_167 + 50_000 / 3) * 3 * 2 * 4.09e9
    assert amp.flops == pytest.approx(flops)
    assert amp.work_minutes == pytest.approx(flops / (4 * 62.5e12) / 60)  # ~10.6 min
    fp32 = point_time_limit(points["v.resnet50.weak.fp32.n0001"], juwels)
    assert fp32.work_minutes == pytest.approx(2 * amp.work_minutes)
    assert fp32.limit_minutes == 50 and amp.limit_minutes == 35
    double = point_time_limit(points["v.resnet50.weak.fp32.n0002"], juwels)
    assert double.work_minutes == pytest.approx(fp32.work_minutes / 2)
    # an AMD GCD runs FP32 convolutions at its fp32 rate: LUMI's 1-node FP32 point is long
    lumi = facts_of(load_cluster("lumi", REPO / "config/clusters", environ={}))
    row = next(p.row() for p in expand_experiment("v", vision, lumi) if p.id.endswith("fp32.n0001"))
    assert point_time_limit(row, lumi).limit_minutes > 2 * fp32.limit_minutes
    # a capped epoch is less work
    capped = point_time_limit(
        {**points["v.resnet50.weak.amp.n0001"], "max_batches_per_epoch": 10}, juwels
    )
    assert capped.flops < amp.flops / 20  # (validation stays whole)


def test_max_nodes_beyond_the_partition_is_refused():
    lumi = facts_of(load_cluster("lumi", REPO / "config/clusters", environ={}))
    assert lumi.partition_nodes == 1024
    with pytest.raises(
        SweepError,
        match=r"max_nodes.lumi: 2048 nodes, but lumi's GPU partition "
        r"has 1024 \(config/clusters/lumi.yaml: gpu_partition.nodes\)",
    ):
        expand_experiment("lang", language(max_nodes={"lumi": 2048}), lumi)


def test_node_counts_that_do_not_reach_max_nodes_are_said():
    notes: list[str] = []
    exp = language(max_nodes={"juwels": 48})
    exp["models"] = {"gpt3_860m": {**exp["models"]["gpt3_860m"], "max_nodes": {}}}
    points = expand_experiment("lang", exp, JUWELS, notes)
    assert max(p.nodes for p in points) == 32
    assert any(
        "max_nodes.juwels is 48, but node counts double from 1: the sweep runs 1, 2, 4, 8, "
        "16, 32 nodes" in n
        for n in notes
    ), notes


@pytest.mark.parametrize("key", ["data", "tokenizer"])
def test_environment_variable_in_a_benchmark_path_is_refused(key):
    with pytest.raises(SweepError, match=rf"benchmarks.experiments.lang.{key}: .*\$SCRATCH"):
        expand_experiment("lang", language(**{key: "$SCRATCH/fineweb/x"}), JUWELS)


def test_a_warm_up_as_long_as_the_run_is_refused_naming_its_key():
    """With warmup_iterations >= iterations every logged iteration is left out: the
    point's metrics would be empty (NaN) after a whole job."""
    with pytest.raises(SweepError) as error:
        expand_experiment("lang", language(iterations=20, warmup_iterations=20), JUWELS)
    assert str(error.value) == (
        "benchmarks.experiments.lang.warmup_iterations: 20 is not fewer than its iterations "
        "(20): every iteration of a run would be left out of its metrics, which would then "
        "measure nothing. Lower warmup_iterations or raise iterations."
    )
    exp = language(iterations=3)
    del exp["warmup_iterations"]
    with pytest.raises(SweepError, match=r"3 is not fewer than its iterations \(3\) "
                       r"\(warmup_iterations unset: the default\)"):  # fmt: skip
        expand_experiment("lang", exp, JUWELS)
    assert expand_experiment("lang", language(iterations=4, warmup_iterations=3), JUWELS)


def test_the_megatron_engine_where_there_is_no_container_is_refused_naming_its_key():
    """Megatron-LM is in the training image; on a cluster without a container runtime and
    without a checkout named, its points failed at start on /opt/Megatron-LM/pretrain_gpt.py."""
    local = facts_of(load_cluster("local", REPO / "config/clusters"))
    exp = language(engine="megatron", max_nodes={"local": 1})
    with pytest.raises(SweepError) as error:
        expand_experiment("lang", exp, local)
    assert str(error.value) == (
        "benchmarks.experiments.lang.engine: megatron runs Megatron-LM's pretrain_gpt.py "
        "from the training container (/opt/Megatron-LM), but cluster local has no container "
        "runtime (config/clusters/local.yaml: container_runtime: none) and names no "
        "Megatron-LM checkout (megatron_lm). Name one there, set engine: torch to run it "
        "here, or leave local out of its max_nodes and run it with a GPU cluster's profile."
    )


def test_the_megatron_engine_runs_bare_metal_from_a_checkout_at_the_pin(tmp_path):
    """A workstation or a site without containers names its Megatron-LM checkout: its
    points expand, and run its pretrain_gpt.py with this environment's Python; a checkout
    whose dataset helpers are not built for this Python is refused, naming them."""
    from dataclasses import replace

    from hpcllm.bench.language import language_launch

    tree = megatron_checkout(tmp_path / "Megatron-LM")
    local = facts_of(load_cluster("local", REPO / "config/clusters"))
    exp = language(engine="megatron", max_nodes={"local": 1})
    points = expand_experiment("lang", exp, replace(local, megatron_lm=str(tree)))
    assert points
    cluster = replace(load_cluster("local", REPO / "config/clusters"), megatron_lm=str(tree))
    argv = language_launch(points[0].row(), tmp_path / "run", cluster, None).argv
    # One rank, still under torchrun: Megatron's env:// start needs MASTER_ADDR and a port
    # (without it: "environment variable MASTER_ADDR expected, but not set").
    assert argv[1:5] == ["--standalone", "--nproc_per_node", "1", "--no-python"], argv[:5]
    # through the Python 3.11 shim (hpcllm.models.megatron_compat), as a segment's job
    program = [sys.executable, "-m", "hpcllm.models.megatron_compat", f"{tree}/pretrain_gpt.py"]
    assert argv[5:9] == program, argv[:10]

    helpers = next(tree.glob("megatron/core/datasets/helpers_cpp*"))
    helpers.unlink()
    with pytest.raises(SweepError, match=rf"helpers are not built for this Python \({helpers}"):
        expand_experiment("lang", exp, replace(local, megatron_lm=str(tree)))
