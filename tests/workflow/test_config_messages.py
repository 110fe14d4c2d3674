"""Plan-time messages about the config and the command line: they say why, and what to do."""

from __future__ import annotations

import shutil

import pytest
from support import REPO, run_snakemake

from hpcllm.commandline import (
    duplicate_keys,
    repeated_configfile,
    target_like_configfiles,
    yaml_syntax_error,
)
from hpcllm.configuration import vision_split_errors
from hpcllm.text.tokenizers_config import retrain_warning

BUILT_IN = ("sample_en", "sample_multilingual", "fineweb")


def shards_of(source):
    return [
        f"data/tokenized/sample_bpe/{source}/{k:04d}_text_document.manifest.json" for k in range(2)
    ]


def test_a_tokenizer_a_new_source_retrains_says_why_and_how_to_pin_it():
    cfg = {"type": "train", "vocab_size": 8000}
    made = {"data/tokenizers/bpe/tokenizer.json", *shards_of("en"), *shards_of("de")}
    warning = retrain_warning("bpe", cfg, ["en", "de", "web"], shards_of, made.__contains__)
    assert "text.tokenizers.bpe trains on every source (it has no sources:)" in warning
    assert "web is new (no shard tokenized yet): bpe will be trained again" in warning
    assert warning.endswith("text.tokenizers.bpe.sources: [en, de] (in your --configfile)")
    # Nothing to say: not trained yet, pinned, nothing new, or a tokenizer from files.
    assert (
        retrain_warning("bpe", cfg, ["en", "web"], shards_of, set(shards_of("en")).__contains__)
        is None
    )
    pinned = {**cfg, "sources": ["en", "de"]}
    assert retrain_warning("bpe", pinned, ["en", "de", "web"], shards_of, made.__contains__) is None
    assert retrain_warning("bpe", cfg, ["en", "de"], shards_of, made.__contains__) is None
    files = {"type": "files", "tokenizer_json": "t.json"}
    assert retrain_warning("bpe", files, ["en", "web"], shards_of, made.__contains__) is None


def test_a_target_passed_as_a_config_file_is_named(tmp_path):
    warnings = target_like_configfiles(
        [tmp_path / "my.yaml", tmp_path / "results/train/x/seg1.json", tmp_path / "notes.txt"],
        tmp_path,
    )
    assert len(warnings) == 2
    assert warnings[0].startswith(
        "--configfile results/train/x/seg1.json: this looks like a target, not a config file "
        "(it is under results/, where the workflow writes its outputs)"
    )
    assert "snakemake results/train/x/seg1.json --configfile my.yaml" in warnings[0]
    assert "(its name does not end in .yaml, .yml, .json)" in warnings[1]


def test_a_second_configfile_option_is_named_with_what_it_drops():
    argv = ["snakemake", "-n", "--configfile", "a.yaml", "b.yaml", "--cores", "2"]
    assert repeated_configfile(argv) is None
    warning = repeated_configfile([*argv, "--configfile=c.yaml", "-p"])
    assert warning == (
        "--configfile is given 2 times: Snakemake reads only the last one's files (c.yaml) "
        "and ignores a.yaml b.yaml. Give every file after one --configfile: --configfile "
        "a.yaml b.yaml c.yaml"
    )


def test_a_yaml_syntax_error_names_file_line_and_column(tmp_path):
    path = tmp_path / "my.yaml"
    path.write_text("text:\n  tokenize:\n    encoder: hf\n  sources: [a, b\nvision: {}\n")
    error = yaml_syntax_error(path)
    assert error.startswith(f"{path}:4:12: YAML syntax error: while parsing a flow sequence")
    assert error.endswith("(found at line 5, column 7)")
    assert "YAML syntax error" in error and "flow sequence" in error
    path.write_text("text:\n  tokenize: {}\n")
    assert yaml_syntax_error(path) is None


def test_a_key_given_twice_in_a_config_file_is_named_by_file_line_and_key(tmp_path):
    """YAML loaders, Snakemake's included, keep the last value silently (issue 40 item 9)."""
    path = tmp_path / "my.yaml"
    path.write_text(
        "text:\n  sources:\n    web:\n      type: local\n      files: a.jsonl\n"
        "      max_documents: 10\n      max_documents: 20\n"
        "base: &base {shots: 0}\nevaluate:\n  <<: *base\n  shots: 1\n"
        "lists:\n  - {a: 1}\n  - {a: 1, a: 2}\n"
    )
    assert duplicate_keys(path) == [
        f"{path}:7: key text.sources.web.max_documents is given twice in this file (first "
        "at line 6); YAML keeps only the last value, silently. Remove one of them (or merge "
        "what each one sets).",
        f"{path}:14: key lists[1].a is given twice in this file (first at line 14); YAML "
        "keeps only the last value, silently. Remove one of them (or merge what each one "
        "sets).",
    ]
    # A key beside a merge (<<) overrides it, as YAML means it; keys equal in text only.
    path.write_text("a: &x {k: 1}\nb:\n  <<: *x\n  k: 2\n1: one\n'1': text\n")
    assert duplicate_keys(path) == []
    path.write_text("a: [1\n")  # a syntax error is said elsewhere
    assert duplicate_keys(path) == [] and duplicate_keys(tmp_path / "missing.yaml") == []


@pytest.mark.workflow
def test_a_dry_run_says_why_a_new_source_retrains_the_tokenizer(workdir):
    # As after a run of the built-in config: the tokenizer and every source's shards exist.
    for path in [
        "data/tokenizers/sample_bpe/tokenizer.json",
        *(p for s in BUILT_IN for p in shards_of(s)),
    ]:
        (workdir / path).parent.mkdir(parents=True, exist_ok=True)
        (workdir / path).write_text("")
    (workdir / "extra.jsonl").write_text('{"text": "one more source"}\n')
    (workdir / "extra.yaml").write_text(
        "text:\n  sources:\n    extra:\n      type: local\n      files: extra.jsonl\n      shards: 1\n"
    )
    proc = run_snakemake(
        workdir,
        "-n",
        "data/tokenized/sample_bpe/extra_text_document.bin",
        "--configfile",
        "extra.yaml",
    )
    out = proc.stdout + proc.stderr
    assert (
        "Warning: text.tokenizers.sample_bpe trains on every source (it has no sources:), and "
        "extra is new (no shard tokenized yet)" in out
    ), out[-3000:]
    assert "text.tokenizers.sample_bpe.sources: [sample_en, sample_multilingual, fineweb]" in out
    # The examples' cap on fineweb is said in the plan, with the file that sets it.
    assert (
        "text.sources.fineweb reads at most 200 documents (max_documents, set in "
        f"{REPO / 'config/examples/local.yaml'}), split evenly over its 2 shards." in out
    )


@pytest.mark.workflow
def test_a_dry_run_names_config_traps_of_the_command_line(workdir):
    (workdir / "a.yaml").write_text("max_gpu_hours: 10\n")
    (workdir / "results/train/x").mkdir(parents=True)
    (workdir / "results/train/x/seg1.json").write_text('{"iterations": 10}\n')
    proc = run_snakemake(
        workdir,
        "-n",
        "--configfile",
        "a.yaml",
        "--configfile",
        "a.yaml",
        "results/train/x/seg1.json",
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert "Warning: --configfile results/train/x/seg1.json: this looks like a target" in out
    assert "Warning: --configfile is given 2 times" in out


@pytest.mark.workflow
def test_a_bad_training_split_names_its_key_at_plan_time(workdir):
    (workdir / "split.yaml").write_text(
        "training:\n  experiments:\n    tiny_local:\n      data:\n        split: '98;2'\n"
    )
    proc = run_snakemake(workdir, "-n", "--configfile", "split.yaml", check=False)
    assert proc.returncode != 0
    assert (
        "training.experiments.tiny_local.data.split: split '98;2': not a comma-separated list"
        in proc.stdout + proc.stderr
    )


@pytest.mark.workflow
def test_a_yaml_syntax_error_in_the_built_in_config_names_its_line(tmp_path):
    work = tmp_path / "work"
    shutil.copytree(REPO / "config", work / "config")
    for name in ("resources", "profiles"):
        (work / name).symlink_to(REPO / name)
    text = (work / "config/config.yaml").read_text()
    (work / "config/config.yaml").write_text(text.replace("repeat: 13", "repeat: [13", 1))
    line = text[: text.index("repeat: 13")].count("\n") + 1
    proc = run_snakemake(work, "-n", check=False)
    assert proc.returncode != 0
    col = text.splitlines()[line - 1].index("repeat") + len("repeat: [")
    assert f"config/config.yaml:{line}:{col}: YAML syntax error: while parsing a flow sequence" in (
        proc.stdout + proc.stderr
    ), (proc.stdout + proc.stderr)[-3000:]
    assert "YAML syntax error" in proc.stdout + proc.stderr


def test_a_vision_benchmark_split_its_dataset_does_not_pack_is_named_by_key():
    datasets = {"imgs": {"splits": ["train"]}, "other": {}}
    experiments = {
        "v": {"benchmark": "vision", "dataset": "imgs", "split": "train", "val_split": None},
        "w": {"benchmark": "vision", "dataset": "imgs", "split": "trian"},
        "x": {"benchmark": "vision", "dataset": "other"},
        "lang": {"benchmark": "language", "split": "anything"},
    }
    assert vision_split_errors(experiments, datasets) == [
        "benchmarks.experiments.w.split: 'trian' is not a split of vision dataset imgs (it "
        "packs train; vision.datasets.imgs.splits)",
        "benchmarks.experiments.w.val_split: 'val' is not a split of vision dataset imgs (it "
        "packs train; vision.datasets.imgs.splits)",
    ]


@pytest.mark.workflow
def test_a_bad_vision_split_names_its_key_at_plan_time(workdir):
    (workdir / "vs.yaml").write_text(
        "benchmarks:\n  experiments:\n    vision_tiny:\n      split: trian\n"
    )
    proc = run_snakemake(workdir, "-n", "--configfile", "vs.yaml", check=False)
    assert proc.returncode != 0
    assert (
        "benchmarks.experiments.vision_tiny.split: 'trian' is not a split of vision dataset "
        "imagenet_sample" in proc.stdout + proc.stderr
    )


def test_a_vision_benchmark_dataset_the_vision_section_lacks_is_named_by_key(tmp_path):
    """Snakemake named only data/vision/<dataset>/train.lmdb, a missing input."""
    (tmp_path / "v.yaml").write_text("benchmark: vision\ndataset: imagenett\n")
    experiments = {
        "w": {"benchmark": "vision", "dataset": "imagenet_smaple"},
        "f": "v.yaml",
        "ok": {"benchmark": "vision", "dataset": "imgs"},
    }
    assert vision_split_errors(experiments, {"imgs": {}}, root=tmp_path) == [
        "benchmarks.experiments.w.dataset: 'imagenet_smaple' is not a dataset of the vision "
        "section (vision.datasets: imgs); name one of them, or add it under vision.datasets "
        "(its root: the folder holding train/ and val/)",
        "benchmarks.experiments.f.dataset (in v.yaml): 'imagenett' is not a dataset of the "
        "vision section (vision.datasets: imgs); name one of them, or add it under "
        "vision.datasets (its root: the folder holding train/ and val/)",
    ]
