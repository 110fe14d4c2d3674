"""Every Megatron-LM command line we generate, parsed by Megatron-LM's own parser.

Megatron-LM's code here is the GPU jobs' release as installed (megatron-core 0.19.0:
``megatron.core`` and ``megatron.training`` of the pinned commit, on Python 3.11 through
hpcllm.models.megatron_compat); ``MEGATRON_LM_DIR`` puts a Megatron-LM tree first
(``git -C Megatron-LM archive <commit> | tar -x -C DIR``). Three checks need the tree's
files outside the package, which the wheel lacks and this repository does not copy
(``pretrain_gpt.py`` for the dataset construction, the helpers' Makefile for the
start-up): they run with ``MEGATRON_LM_DIR`` or, where it is unset, the shared reference
copy of the pin's tree (tests/conftest.py), and say so when skipped (in CI such a skip
fails). It builds every command line
the workflow generates (every preset on every GPU cluster, the shipped experiment on
every GPU cluster, every point of the shipped language sweeps on every cluster, and the
canaries of both) and runs ``parse_args`` and ``validate_args`` of
``megatron.training.arguments`` on each, then builds its tokenizer and learning-rate
schedule as ``pretrain_gpt.py`` does at start-up, in one subprocess
(scripts/megatron_lm_parser.py, which says what it stubs on a CPU-only machine). Then
the same command lines, scaled down, build Megatron-LM's TransformerConfig and GPT model
on the CPU in an image's environment (``model``: no Transformer Engine, no apex for
``--transformer-impl local``), and hpcllm's own derivation of that config (which
test_megatron_model_cpu.py builds with Megatron Core alone) must equal Megatron-LM's.
In CI a skip for lack of Megatron Core fails (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml
from megatron_cases import (
    CLUSTERS,
    all_cases,
    training_cases,
    transformer_impl,
    writable_tree_copy,
)
from support import REPO, hang_guard

from hpcllm.clusters import load_cluster
from hpcllm.models.megatron_args import MEGATRON_ENV, MEGATRON_LM_COMMIT, MEGATRON_LM_RELEASE
from hpcllm.models.megatron_compat import MEGATRON_CORE
from hpcllm.models.presets import PRESETS
from hpcllm.training.engines.command import engine_command as segment_command
from hpcllm.training.engines.megatron_model import IMAGE_LACKS
from hpcllm.training.plan.experiment import Paths

# A Megatron-LM tree at the pin, first on the path before the installed release:
# MEGATRON_LM_DIR, or the shared reference copy (tests/conftest.py sets it to that).
MEGATRON_LM_DIR = os.environ.get("MEGATRON_LM_DIR")
needs_tree = pytest.mark.skipif(
    not MEGATRON_LM_DIR,
    reason="needs a Megatron-LM tree at the pin (MEGATRON_LM_DIR, or the reference copy "
    f"../shared/reference/megatron-lm-{MEGATRON_LM_RELEASE} from the project's root): pretrain_gpt.py and the dataset helpers' Makefile are not in "
    "the release's wheel, and this repository copies no Megatron-LM code",
)


def run_parser(mode: str, cases, timeout: float | None = None, tree=None):
    """scripts/megatron_lm_parser.py MODE with ``tree`` (default: MEGATRON_LM_DIR, if set)
    first on its path, before the installed release."""
    done = parser_process([mode], json.dumps(cases), timeout, tree)
    return json.loads(done.stdout.strip().splitlines()[-1])


def parser_process(args: list[str], stdin: str, timeout: float | None = None, tree=None):
    tree = tree or MEGATRON_LM_DIR
    # python3 and python3-config on the PATH are this environment's, as in an image:
    # Megatron's Makefile runs `python3 -m pybind11` and names the module by
    # `python3-config --extension-suffix` (a venv has no python3-config: its base's)
    bins = [Path(sys.executable).parent, sysconfig.get_config_var("BINDIR")]
    path = os.pathsep.join([*map(str, bins), os.environ.get("PATH", "")])
    python_path = os.pathsep.join(
        p for p in (tree and str(tree), os.environ.get("PYTHONPATH")) if p
    )
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "megatron_lm_parser.py"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        # offline, as on compute nodes: a tokenizer that needs the hub fails, not hangs
        env={**os.environ, "PYTHONPATH": python_path, "HF_HUB_OFFLINE": "1", "PATH": path},
        check=False,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_flag_list_is_every_option_of_the_parser():
    """tests/data/megatron_flags.txt, which test_megatron_args checks every generated flag
    against, is what the parser script's ``flags`` prints (its header says how)."""
    done = parser_process(["flags", MEGATRON_LM_COMMIT], "", timeout=hang_guard(30))
    assert done.stdout == (REPO / "tests/data/megatron_flags.txt").read_text()


def unbuilt_tree(dest: Path) -> Path:
    """A writable copy of MEGATRON_LM_DIR's tree without built dataset helpers."""
    return writable_tree_copy(MEGATRON_LM_DIR, dest, "tests", "docs", "examples", "helpers_cpp*")


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> list[dict]:
    return all_cases(tmp_path_factory.mktemp("cases"))


@pytest.fixture(scope="module")
def checked(cases) -> dict[str, list[dict]]:
    """scripts/megatron_lm_parser.py ``model`` on every distinct generated command line,
    per image (``--transformer-impl``): one pass parses, validates and starts each up
    (what ``parse`` does) and builds its config and scaled-down model. A command line
    generated twice (the same words, world size and environment) is checked once, under
    its first name."""
    distinct = {}
    for case in cases:
        distinct.setdefault(json.dumps([case["argv"], case["world_size"], case["env"]]), case)
    out = {}
    for impl in sorted(IMAGE_LACKS):
        mine = [c for c in distinct.values() if transformer_impl(c) == impl]
        assert mine, impl
        # hang guard: about 0.5 s per command line on a quiet machine
        request = {"without": list(IMAGE_LACKS[impl]), "cases": mine}
        out[impl] = run_parser("model", request, timeout=hang_guard(len(mine)))
    return out


def test_megatron_parses_every_generated_command_line(cases, checked):
    names = [c["name"] for c in cases]
    assert {n.split()[1] for n in names if n.startswith("train")} >= set(PRESETS)
    for kind in ("train opengptx_800m on", "canary train opengptx_800m", "bench", "canary bench"):
        assert any(n.startswith(kind) for n in names), kind
    # the straggler detector's flags, as the segments add them where the image can run it
    assert sum("--log-straggler" in c["argv"] for c in cases) >= len(PRESETS)
    results = [r for impl in checked.values() for r in impl]
    failed = [f"{r['name']}: {r['error']}" for r in results if not r["parsed"]]
    assert not failed, f"{len(failed)} of {len(results)} refused:\n" + "\n".join(failed[:20])
    print(
        f"Megatron-LM {MEGATRON_LM_COMMIT[:12]} parsed and validated {len(results)} distinct "
        f"command lines of {len(cases)}"
    )


@needs_tree
def test_megatron_starts_up_and_compiles_its_dataset_helpers(tmp_path):
    """Rank 0's start-up of a segment's command line (pretrain_gpt.py's
    parse_and_validate_args, then initialize_megatron up to its first GPU call), in a
    copy of the tree without a built helpers module: its _compile_dependencies runs
    ``make`` in megatron/core/datasets (pybind11, a C++ compiler) and the helpers then
    import, as on every GPU job. The images build them beforehand (envs/*, checked by
    tests/clusters/test_containers.py): without pybind11 or with a read-only unbuilt tree
    this start-up exits, and so did every job on LUMI."""
    tree = unbuilt_tree(tmp_path / "Megatron-LM")
    assert not list((tree / "megatron/core/datasets").glob("helpers_cpp*"))
    case = training_cases(tmp_path)[0]
    result = run_parser("initialize", case, tree=tree)
    assert Path(result["helpers"]).parent == tree / "megatron/core/datasets", result["log"]
    assert "done with dataset index builder" in result["log"]


@pytest.mark.parametrize("impl", sorted(IMAGE_LACKS))
def test_megatron_builds_every_command_lines_model_in_its_image(checked, impl):
    """Megatron-LM's TransformerConfig of every generated command line of ``impl``, and
    its GPT model, scaled down, on the CPU without what that image lacks (LUMI's: TE and
    apex), one micro-batch forward and backward; hpcllm's derivation of the config
    equals Megatron-LM's field by field."""
    results = checked[impl]
    failed = [f"{r['name']}: {r['error']}" for r in results if not r["ok"]]
    assert not failed, f"{len(failed)} of {len(results)} failed:\n" + "\n".join(failed[:20])
    differ = [f"{r['name']}: {r['differ']}" for r in results if r["differ"]]
    assert not differ, (
        "hpcllm.training.engines.megatron_model derives another config:\n" + "\n".join(differ[:20])
    )
    built = sum(r["model"] == "built" for r in results)
    if impl == "local":  # Megatron's own layers: every model is built here
        assert built == len(results)
    print(f"{impl}: {len(results)} configs equal, {built} models built on the CPU")


@needs_tree
def test_megatron_loads_the_index_cache_that_the_cpu_rule_built(text_workdir, monkeypatch):
    """prepare_data_cache's index files, found by Megatron-LM's own dataset construction
    for the segment's command line: it builds nothing (its cache key, tokenizer included,
    equals ours), so the GPU job only loads them."""
    from snakemake.utils import validate

    from hpcllm.training.engines.cache import build_index_cache
    from hpcllm.training.plan.experiment import prepare_experiment

    config = yaml.safe_load((REPO / "config/examples/local.yaml").read_text())
    for section in ("text", "training"):  # the schema's defaults, as the workflow fills them
        validate(config[section], str(REPO / f"workflow/schemas/{section}.schema.yaml"))
    name = "tiny_local"
    raw = {**config["training"]["experiments"][name], "engine": "megatron"}
    raw["data"] = {**raw["data"], "split": "90,8,2"}  # a test split too: all three built
    monkeypatch.chdir(text_workdir)  # relative paths, as the workflow runs
    prepared = prepare_experiment(name, raw, config["text"], load_cluster("juwels", CLUSTERS))
    cache = "data/index_cache/conformance"
    paths = Paths(f"checkpoints/{name}", "seg1.json", "seg1.engine.log", cache, "tb")
    record = build_index_cache(prepared, cache, "data/index_cache/conformance.json")
    assert all(record["built"]) and record["files"]
    argv = segment_command(
        prepared.experiment, prepared.layout, prepared.blend, prepared.tokenizer_files,
        paths, 1, None, transformer_impl="local",
    )  # fmt: skip
    assert "--tokenizer-model" in argv  # the trained tokenizer's folder holds tokenizer.json
    case = {"argv": argv[2:], "world_size": prepared.layout.gpus, "env": MEGATRON_ENV}
    result = run_parser("datasets", case)
    # one release: the workflow's Megatron Core built it, the jobs' loads it
    assert record["megatron_core"] == MEGATRON_CORE
    if not MEGATRON_LM_DIR:
        assert result["megatron_core"] == MEGATRON_CORE
    assert result["samples"] == [record["samples"][k] for k in ("train", "valid", "test")]
    assert result["after"] == result["before"] == record["files"], result["log"]
    assert result["sizes"] == record["built"]
    # Megatron's end-of-document id (from the tokenizer_config.json's eos_token) is ours
    assert (
        result["eod"] == json.loads(Path(prepared.tokenizer_files[0]).read_text())["<|endoftext|>"]
    )


@needs_tree
def test_megatron_reads_a_given_unigram_tokenizer_json_and_its_index_cache(tmp_path, monkeypatch):
    """A type: files tokenizer given as tokenizer.json alone, not BPE (a SentencePiece-style
    Unigram, EOD </s>): the segment's command line passes Megatron-LM's parser and
    start-up (HuggingFaceTokenizer with the tokenizer_folder), and Megatron-LM's dataset
    construction finds the index cache prepare_data_cache built (the same key) with the
    workflow's EOD id."""
    import numpy as np
    from snakemake.utils import validate
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    from hpcllm.text.indexed_dataset import IndexedDatasetWriter
    from hpcllm.text.tokenization import read_texts
    from hpcllm.text.tokenizers_config import write_hf_folder
    from hpcllm.training.engines.cache import build_index_cache
    from hpcllm.training.plan.experiment import prepare_experiment

    texts = [t for b in read_texts(REPO / "resources/sample_text/en.jsonl.zst", 1 << 20) for t in b]
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(
        texts,
        trainers.UnigramTrainer(
            vocab_size=500, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>"
        ),
    )
    monkeypatch.chdir(tmp_path)  # relative paths, as the workflow runs
    tok.save("given.json")
    eod = tok.token_to_id("</s>")
    with IndexedDatasetWriter("data/tokenized/euro/sample_en_text_document", np.uint16) as w:
        for text in texts:
            w.add_document(tok.encode(text).ids + [eod])
    config = yaml.safe_load((REPO / "config/examples/local.yaml").read_text())
    given = {"type": "files", "tokenizer_json": "given.json", "eod_token": "</s>"}
    config["text"]["tokenizers"]["euro"] = given
    config["text"]["tokenize"]["tokenizers"] = ["euro"]
    for section in ("text", "training"):
        validate(config[section], str(REPO / f"workflow/schemas/{section}.schema.yaml"))
    write_hf_folder(config["text"]["tokenizers"]["euro"], "given.json", "data/tokenizers/euro/hf")
    raw = {**config["training"]["experiments"]["tiny_local"], "engine": "megatron"}
    raw["data"] = {"tokenizer": "euro", "sources": {"sample_en": 1.0}, "split": "90,8,2"}
    prepared = prepare_experiment("euro", raw, config["text"], load_cluster("juwels", CLUSTERS))
    cache = "data/index_cache/euro"
    paths = Paths("checkpoints/euro", "seg1.json", "seg1.engine.log", cache, "tb")
    record = build_index_cache(prepared, cache, "data/index_cache/euro.json")
    argv = segment_command(
        prepared.experiment, prepared.layout, prepared.blend, prepared.tokenizer_files,
        paths, 1, None, transformer_impl="local", eod_token=prepared.eod_token,
    )  # fmt: skip
    at = argv.index("--tokenizer-type")
    assert argv[at : at + 4] == [
        "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "data/tokenizers/euro/hf"
    ]  # fmt: skip
    case = {
        "name": "euro",
        "argv": argv[2:],
        "world_size": prepared.layout.gpus,
        "env": MEGATRON_ENV,
    }
    parsed = run_parser("parse", [case])
    assert parsed[0]["ok"], parsed[0]["error"]
    result = run_parser("datasets", case)
    assert result["after"] == result["before"] == record["files"], result["log"]
    assert result["sizes"] == record["built"]
    assert result["eod"] == eod
    print(f"Megatron-LM {MEGATRON_LM_COMMIT[:12]}: Unigram folder, EOD {eod}, cache found")
