"""The model of every generated ``--transformer-impl local`` command line, built on the
CPU with Megatron Core from the package index, in an image without Transformer Engine
and apex (LUMI's ROCm image): a fusion left on that needs them fails here, as it would
at start-up on the cluster ("apply_rope_fusion is not available").

hpcllm.training.engines.megatron_model derives the TransformerConfig as the pinned Megatron-LM
does (test_megatron_conformance.py checks that derivation against Megatron-LM's own);
the model is scaled down (2 layers, hidden size 64)
and runs one micro-batch forward and backward, in a subprocess that cannot import what
the image lacks.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from megatron_cases import bench_cases, training_cases, transformer_impl
from support import hang_guard

from hpcllm.models.megatron_args import FLAGS, MEGATRON_LM_COMMIT
from hpcllm.training.engines.megatron_model import (
    CONFIG_EFFECT,
    IMAGE_LACKS,
    model_kwargs,
    sequence_parallel,
    tiny_argv,
    transformer_config_kwargs,
)

# A fusion flag of the local command lines -> what Megatron Core says without it there.
NEEDED = {
    "--no-rope-fusion": "apply_rope_fusion is not available",
    "--no-gradient-accumulation-fusion": "fused_weight_gradient_mlp_cuda",
    "--no-masked-softmax-fusion": "scaled_masked_softmax_cuda",
    "--no-persist-layer-norm": "persist_layer_norm not supported by torch LayerNorm",
}


def check_models(cases: list[dict]) -> list[dict]:
    request = {"without": list(IMAGE_LACKS["local"]), "cases": cases}
    done = subprocess.run(
        [sys.executable, "-m", "hpcllm.training.engines.megatron_model"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        check=False,
        timeout=hang_guard(5 * len(cases)),  # about 1 s per model on a quiet machine
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def distinct_models(cases: list[dict]) -> list[dict]:
    """One case per distinct scaled-down model (most command lines differ only in
    batch sizes, schedules and paths, which do not reach the model)."""
    seen = {}
    for case in cases:
        tiny = tiny_argv(case["argv"])[:-1]
        key = json.dumps(
            [transformer_config_kwargs(tiny), sequence_parallel(case["argv"]), model_kwargs(tiny)],
            sort_keys=True,
        )
        seen.setdefault(key, case)
    return list(seen.values())


@pytest.fixture(scope="module")
def local_cases(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cases")
    cases = [c for c in training_cases(tmp) + bench_cases(tmp) if transformer_impl(c) == "local"]
    assert cases, "no cluster generates --transformer-impl local (LUMI did)"
    return cases


def test_every_generated_option_has_a_known_effect_on_the_model():
    missing = sorted(set(FLAGS[MEGATRON_LM_COMMIT]) - set(CONFIG_EFFECT))
    assert not missing, f"add to megatron_model.CONFIG_EFFECT: {missing}"


def test_the_local_command_lines_build_their_model_without_te_and_apex(local_cases):
    models = distinct_models(local_cases)
    results = check_models(models)
    failed = [f"{r['name']}: {r['error']}" for r in results if not r["ok"]]
    assert not failed, (
        f"{len(failed)} of {len(results)} distinct models (of {len(local_cases)} command "
        "lines) fail without Transformer Engine and apex:\n" + "\n".join(failed)
    )
    assert all(r["parameters"] > 0 and r["loss"] > 0 for r in results)


def test_each_fusion_flag_of_the_local_command_lines_is_needed(local_cases):
    """The same models, each with one of its fusion-off flags left out, fail with the
    error Megatron Core gives in the image: the test above would catch its loss."""
    cases = []
    for flag, error in NEEDED.items():
        for case in distinct_models(local_cases):
            argv = case["argv"]
            if flag in argv and (flag != "--no-masked-softmax-fusion" or "--bf16" in argv):
                # the masked-softmax kernel is imported for half-precision inputs only
                left_out = [a for a in argv if a != flag]
                cases.append({"name": f"{case['name']} without {flag}", "argv": left_out})
                break
        else:
            pytest.fail(f"no local command line passes {flag} (needed: {error})")
    results = check_models(cases)
    for (flag, error), result in zip(NEEDED.items(), results, strict=True):
        assert not result["ok"], f"{result['name']} built: {flag} is not needed"
        assert error in result["error"], result["error"]
