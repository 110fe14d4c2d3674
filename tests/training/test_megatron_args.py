"""Megatron-LM's pretrain_gpt.py arguments: pinned per preset, valid for the pinned commit."""

from __future__ import annotations

import sys

import pytest
from support import REPO

from hpcllm.models.megatron_args import (
    MEGATRON_LM_COMMIT,
    MegatronArgsError,
    exit_duration_minutes,
    pretrain_gpt_args,
)
from hpcllm.models.planner import check_layout
from hpcllm.models.presets import PRESETS, resolve_experiment

GPUS = {"tiny": 1, "gpt3_860m": 1, "gpt3_175b": 1024, "gpt_13b6": 160}


def args_for(preset: str, **kw) -> list[str]:
    exp = resolve_experiment("x", {"preset": preset, "save_interval": 100})
    layout = check_layout("x", exp, GPUS.get(preset, 8))
    options = dict(
        data_path=["0.7", "data/a_text_document", "0.3", "data/b_text_document"],
        split="949,50,1",
        tokenizer_model="tok",
        save="checkpoints/x",
        tensorboard_dir="checkpoints/x/tensorboard",
        data_cache_path="checkpoints/x/data_cache",
        train_iters=3000,
        stop_iteration=1000,
        exit_minutes=1430,
    )
    options.update(kw)
    return pretrain_gpt_args(exp, layout, **options)


def pairs(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[a] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def test_opengptx_800m_arguments_are_the_reports():
    got = pairs(args_for("opengptx_800m"))
    expected = {
        "--num-layers": "16", "--hidden-size": "2048", "--num-attention-heads": "8",
        "--seq-length": "2048", "--micro-batch-size": "4", "--global-batch-size": "512",
        "--position-embedding-type": "rope", "--attention-backend": "flash",
        "--sequence-parallel": None, "--bf16": None, "--adam-beta1": "0.9",
        "--adam-beta2": "0.95", "--lr": "0.00025", "--min-lr": "2.5e-05",
        "--lr-decay-style": "cosine", "--clip-grad": "1", "--weight-decay": "0.1",
        "--use-distributed-optimizer": None, "--tensor-model-parallel-size": "2",
        "--pipeline-model-parallel-size": "1", "--save": "checkpoints/x",
        "--load": "checkpoints/x", "--log-throughput": None, "--exit-signal-handler": None,
        "--exit-duration-in-mins": "1430", "--exit-interval": "1000", "--train-iters": "3000",
        "--tensorboard-dir": "checkpoints/x/tensorboard", "--split": "949,50,1",
        "--tokenizer-type": "HuggingFaceTokenizer", "--tokenizer-model": "tok",
    }  # fmt: skip
    for flag, value in expected.items():
        assert flag in got, flag
        assert got[flag] == value, flag
    argv = args_for("opengptx_800m")
    i = argv.index("--data-path")
    assert argv[i + 1 : i + 5] == ["0.7", "data/a_text_document", "0.3", "data/b_text_document"]


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        ("gpt3_175b", {"--num-layers": "96", "--hidden-size": "12288", "--tensor-model-parallel-size": "8", "--pipeline-model-parallel-size": "16", "--global-batch-size": "1536", "--recompute-granularity": "selective", "--position-embedding-type": "learned_absolute"}),
        ("gpt3_860m", {"--num-layers": "20", "--hidden-size": "1792", "--num-attention-heads": "14", "--tensor-model-parallel-size": "1"}),
        ("gpt_7b", {"--num-layers": "32", "--hidden-size": "4096", "--num-attention-heads": "32"}),
        ("gpt_13b6", {"--num-layers": "40", "--hidden-size": "5120", "--pipeline-model-parallel-size": "2", "--recompute-granularity": "full", "--recompute-method": "uniform"}),
    ],
)  # fmt: skip
def test_preset_arguments_are_pinned(preset, expected):
    got = pairs(args_for(preset))
    for flag, value in expected.items():
        assert got.get(flag, "MISSING") == value, flag


MEGATRON_FLAGS = REPO / "tests" / "data" / "megatron_flags.txt"


def megatron_flags() -> set[str]:
    """Every flag of the pinned commit's parser, listed independently of our flag table."""
    lines = MEGATRON_FLAGS.read_text().splitlines()
    assert MEGATRON_LM_COMMIT in lines[0], "megatron_flags.txt was made at another commit"
    return {line for line in lines if line.startswith("--")}


def test_flag_list_is_megatrons_not_ours():
    flags = megatron_flags()
    assert len(flags) > 500  # the whole parser, not a copy of the table
    assert "--data-impl" not in flags and "--use-mcore-models" in flags  # removed / kept


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("variant", ["data", "mock", "amd", "hf"])
def test_only_flags_of_the_pinned_commit(preset, variant):
    kw = {
        "data": {},
        "mock": dict(data_path=None, tokenizer_model=None, save=None),
        "amd": dict(transformer_impl="local"),
        "hf": dict(tokenizer_model="data/tokenizers/x"),
    }[variant]
    flags = [a for a in args_for(preset, **kw) if a.startswith("--")]
    unknown = set(flags) - megatron_flags()
    assert not unknown, f"not flags of Megatron-LM {MEGATRON_LM_COMMIT[:12]}: {unknown}"
    assert len(flags) == len(set(flags))


def test_mock_data_needs_no_vocabulary_and_saves_nothing():
    got = pairs(args_for("gpt3_175b", data_path=None, tokenizer_model=None, save=None))
    assert "--mock-data" in got and "--data-path" not in got
    assert got["--tokenizer-type"] == "NullTokenizer" and got["--vocab-size"] == "50257"
    assert "--vocab-file" not in got and "--merge-file" not in got
    assert "--save" not in got and "--load" not in got and "--save-interval" not in got
    with pytest.raises(MegatronArgsError, match="a dataset needs its tokenizer's folder"):
        args_for("gpt_7b", tokenizer_model=None)


def test_tokenizer_folder_is_read_offline_by_huggingface_tokenizer():
    # never GPT2BPETokenizer: at the pin it asks the hub for gpt2's configuration at
    # start-up and takes a gpt2 snapshot in HF_HOME over the files it is given
    got = pairs(args_for("gpt_7b", tokenizer_model="data/tokenizers/x"))
    assert got["--tokenizer-type"] == "HuggingFaceTokenizer"
    assert got["--tokenizer-model"] == "data/tokenizers/x" and "--vocab-file" not in got


def test_amd_gpus_and_nodes_without_te_run_megatrons_own_layers():
    from types import SimpleNamespace

    from hpcllm.models.megatron_args import transformer_impl_for

    amd = SimpleNamespace(gpu=SimpleNamespace(vendor="amd"))
    nvidia = SimpleNamespace(gpu=SimpleNamespace(vendor="nvidia"))
    assert transformer_impl_for(amd) == "local"
    assert transformer_impl_for(nvidia) == "transformer_engine"
    # An NVIDIA node or venv without Transformer Engine says so in its facts.
    without_te = SimpleNamespace(gpu=nvidia.gpu, transformer_engine=False)
    assert transformer_impl_for(without_te) == "local"
    with_te = SimpleNamespace(gpu=amd.gpu, transformer_engine=True)  # a ROCm image with TE
    assert transformer_impl_for(with_te) == "transformer_engine"
    got = pairs(args_for("opengptx_800m", transformer_impl="local"))
    assert got["--transformer-impl"] == "local" and "--attention-backend" not in got


def test_a_checkout_runs_te_layers_only_where_the_jobs_python_has_transformer_engine(
    monkeypatch,
):
    """Jobs without a container run the megatron_lm checkout on this Python: without a
    transformer_engine fact, whether TE is there decides, and the plan says why (the
    default layers would stop at model set-up: "apply_rope_fusion is not available")."""
    from types import SimpleNamespace

    from hpcllm.models import megatron_args

    nvidia = SimpleNamespace(vendor="nvidia")
    checkout = SimpleNamespace(
        gpu=nvidia, container_runtime="none", megatron_lm="/m", path="c.yaml"
    )
    monkeypatch.setattr(megatron_args, "has_transformer_engine", lambda: False)
    impl, why = megatron_args.transformer_impl_and_reason(checkout)
    assert impl == "local"
    assert f"the jobs' Python ({sys.executable}, which runs the megatron_lm checkout)" in why
    assert "no Transformer Engine" in why and "transformer_engine: false in c.yaml" in why
    monkeypatch.setattr(megatron_args, "has_transformer_engine", lambda: True)
    assert megatron_args.transformer_impl_for(checkout) == "transformer_engine"
    # the cluster file's fact wins over what is found; an image's does not look here
    fact = SimpleNamespace(**{**vars(checkout), "transformer_engine": False})
    assert megatron_args.transformer_impl_and_reason(fact) == (
        "local",
        "c.yaml: transformer_engine: false",
    )
    image = SimpleNamespace(**{**vars(checkout), "container_runtime": "apptainer"})
    monkeypatch.setattr(megatron_args, "has_transformer_engine", lambda: False)
    assert megatron_args.transformer_impl_for(image) == "transformer_engine"


def test_a_checkouts_pretrain_gpt_runs_through_the_python_311_shim():
    """The image's script runs as it is (Python 3.12 there); a checkout's, run by this
    environment's Python, through hpcllm.models.megatron_compat."""
    from hpcllm.clusters import MEGATRON_IN_IMAGE
    from hpcllm.models.megatron_args import pretrain_gpt_program

    assert pretrain_gpt_program("python", MEGATRON_IN_IMAGE) == [
        "python",
        f"{MEGATRON_IN_IMAGE}/pretrain_gpt.py",
    ]
    assert pretrain_gpt_program("/v/bin/python", "/m") == [
        "/v/bin/python", "-m", "hpcllm.models.megatron_compat", "/m/pretrain_gpt.py"
    ]  # fmt: skip


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the shim is for Python 3.11")
def test_the_checkout_check_refuses_a_python_the_pin_cannot_run_on(tmp_path, monkeypatch):
    """On 3.11 the pin needs typing_extensions.override (the shim's); without it the
    checkout is refused at plan time, naming the Python and the fix."""
    from hpcllm.models.megatron_args import checkout_problem, python_problem

    assert python_problem() is None
    monkeypatch.setitem(sys.modules, "typing_extensions", None)  # import fails
    (tmp_path / "pretrain_gpt.py").touch()
    (tmp_path / "megatron/core").mkdir(parents=True)
    (tmp_path / "megatron/core/package_info.py").write_text("MAJOR = 0\nMINOR = 19\nPATCH = 1\n")
    problem = checkout_problem(tmp_path)
    assert problem.startswith(f"megatron_lm {tmp_path}: the jobs' Python {sys.executable} (3.11")
    assert "needs Python >= 3.12, or 3.11 with typing_extensions >= 4.4" in problem
    assert "pip install 'typing_extensions>=4.4'" in problem
    assert pairs(args_for("opengptx_800m"))["--transformer-impl"] == "transformer_engine"


def test_last_segment_has_no_exit_interval_and_no_time_limit_without_slurm():
    got = pairs(args_for("gpt_7b", stop_iteration=3000, exit_minutes=None))
    assert "--exit-interval" not in got and "--exit-duration-in-mins" not in got


def test_exit_duration_from_remaining_time():
    assert exit_duration_minutes(24 * 3600, 600) == 1430
    assert exit_duration_minutes(None, 600) is None
    with pytest.raises(MegatronArgsError, match="less than the safety margin"):
        exit_duration_minutes(300, 600)


def test_unknown_commit_is_refused():
    with pytest.raises(MegatronArgsError, match="no flag table"):
        args_for("gpt_7b", commit="0" * 40)


def test_container_recipe_must_build_the_pinned_commit():
    from hpcllm.models.megatron_args import container_commit_mismatch

    label = f"%labels\n    org.hpcllm.megatron-commit {MEGATRON_LM_COMMIT}\n"
    ok = f"%post\n    MEGATRON_COMMIT={MEGATRON_LM_COMMIT}\n{label}"
    assert container_commit_mismatch(ok, "a.def") is None
    other = f"%post\n    MEGATRON_COMMIT=001d15c455caa88fdb495435842f25ae69d2c1c3\n{label}"
    assert "builds Megatron-LM 001d15c455ca" in container_commit_mismatch(other, "a.def")
    mislabelled = ok.replace(f"commit {MEGATRON_LM_COMMIT}", "commit 307dcf37")
    assert "not the commit it builds" in container_commit_mismatch(mislabelled, "a.def")
    assert "names no MEGATRON_COMMIT" in container_commit_mismatch("%post\n", "a.def")


def test_shipped_container_recipes_build_the_pinned_commit():
    from hpcllm.models.megatron_args import container_commit_mismatch

    for name in ("megatron-nvidia.def", "megatron-rocm.def"):
        path = REPO / "envs" / name
        assert container_commit_mismatch(path.read_text(), str(path)) is None


LOCAL_ONLY = (
    "--no-rope-fusion",
    "--no-gradient-accumulation-fusion",
    "--no-masked-softmax-fusion",
    "--no-persist-layer-norm",
)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_without_transformer_engine_the_fusions_that_need_it_are_off(preset):
    """Issue 21, LUMI: at the pin RoPE fusion is on by default and needs Transformer
    Engine ("apply_rope_fusion is not available"), gradient accumulation fusion apex's
    fused_weight_gradient_mlp_cuda, the masked-softmax fusion Megatron's compiled kernel
    (fp16): the ROCm image has none of them."""
    local = args_for(preset, transformer_impl="local")
    assert all(flag in local for flag in LOCAL_ONLY), local
    assert set(LOCAL_ONLY) <= megatron_flags()  # the pin's own names
    # Transformer Engine provides them: the NVIDIA command lines keep Megatron's defaults
    assert not set(LOCAL_ONLY) & set(args_for(preset))
    # torch's norm (no apex) refuses sequence parallelism: off on the local layers only
    assert "--sequence-parallel" not in local
    if PRESETS[preset].get("layout", {}).get("sequence_parallel"):
        assert "--sequence-parallel" in args_for(preset)


@pytest.mark.parametrize("preset", ["opengptx_800m", "gpt3_175b", "gpt_13b6", "gpt_7b"])
def test_data_parallel_communication_overlaps_with_compute(preset):
    """Every preset with the distributed optimizer overlaps its gradient reduce-scatter
    and parameter all-gather with backward/forward (both off by default in Megatron-LM)."""
    got = pairs(args_for(preset))
    assert "--use-distributed-optimizer" in got
    assert "--overlap-grad-reduce" in got and "--overlap-param-gather" in got


def test_overlap_param_gather_only_with_the_distributed_optimizer():
    # Megatron-LM's validate_args refuses --overlap-param-gather without it
    exp = resolve_experiment("x", {"preset": "gpt3_860m", "save_interval": 100})
    kw = dict(data_path=None, split="100,0,0", save=None,
              tensorboard_dir=None, data_cache_path=None, train_iters=10, stop_iteration=10,
              exit_minutes=None)  # fmt: skip
    got = pairs(pretrain_gpt_args(exp, check_layout("x", exp, 8), **kw))
    assert "--overlap-grad-reduce" in got and "--overlap-param-gather" not in got
    # one replica: nothing to reduce across
    got = pairs(pretrain_gpt_args(exp, check_layout("x", exp, 1), **kw))
    assert "--overlap-grad-reduce" not in got


def test_fully_reshardable_checkpoints_where_the_campaign_asks():
    """layout.reshardable_checkpoints: the pin's --dist-ckpt-optim-fully-reshardable with
    the distributed optimizer (the only optimizer it changes), a flag of the pinned
    commit; auto asks for it where the layout is chosen automatically."""
    flag = "--dist-ckpt-optim-fully-reshardable"
    assert flag in megatron_flags()

    def argv(transformer_impl="transformer_engine", save="checkpoints/x", **layout):
        exp = resolve_experiment("x", {"preset": "opengptx_800m", "save_interval": 100})
        exp["layout"].update(layout)
        return args_for_experiment(exp, transformer_impl=transformer_impl, save=save)

    assert flag not in argv()  # auto, a fixed layout: Megatron's faster default
    assert flag in argv(reshardable_checkpoints=True)
    assert flag in argv(auto=True)  # the hook of an automatically chosen layout
    assert flag not in argv(auto=True, reshardable_checkpoints=False)
    assert flag not in argv(reshardable_checkpoints=True, distributed_optimizer=False)
    assert flag not in argv(reshardable_checkpoints=True, save=None)  # saves nothing
    # Megatron's local layers resume without the distributed optimizer (as_run)
    assert flag not in argv("local", reshardable_checkpoints=True)


def args_for_experiment(exp, **kw) -> list[str]:
    options = dict(data_path=None, split="100,0,0", tensorboard_dir=None,
                   data_cache_path=None, train_iters=10, stop_iteration=10, exit_minutes=None)  # fmt: skip
    options.update(kw)
    return pretrain_gpt_args(exp, check_layout("x", exp, 8), **options)
