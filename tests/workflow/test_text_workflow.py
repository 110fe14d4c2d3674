"""The text stages through Snakemake on the built-in configuration."""

from __future__ import annotations

import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset
from support import REPO, make_workdir, run_snakemake

from hpcllm.configuration import config_reference
from hpcllm.text.sample_corpus import write_hub_mirror  # noqa: F401  (the mirror's writer)
from hpcllm.text.sources import shard_documents
from hpcllm.text.tokenization import load_tokenizer, read_texts

SOURCES = ("sample_en", "sample_multilingual", "fineweb")
TARGETS = [
    f"data/tokenized/sample_bpe/{s}_text_document.{e}" for s in SOURCES for e in ("bin", "idx")
]

pytestmark = pytest.mark.workflow


def source_texts(workdir, name, cfg):
    docs = shard_documents(name, cfg, 0, 1, base=workdir)
    return [d.text for d in docs if d.text.strip()]


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    work = make_workdir(tmp_path_factory.mktemp("text") / "work")
    run_snakemake(work, "--cores", "2", *TARGETS)
    return work


def test_merged_datasets_hold_the_reference_ids_in_source_order(text_run):
    import yaml

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    tok = load_tokenizer(text_run / "data/tokenizers/sample_bpe/tokenizer.json")
    eod = tok.token_to_id("<|endoftext|>")
    for name in SOURCES:
        cfg = {**config["text"]["sources"][name], "mirror": None}
        if name == "fineweb":
            cfg["mirror"] = str(REPO / config["text"]["sources"][name]["mirror"])
        texts = source_texts(text_run, name, cfg)
        if "max_documents" in cfg:
            texts = texts[: cfg["max_documents"]]
        ds = IndexedDataset(str(text_run / f"data/tokenized/sample_bpe/{name}_text_document"))
        assert len(ds) == len(texts) > 0, name
        for doc, text in zip(ds, texts, strict=True):
            assert doc.tolist() == tok.encode(text, add_special_tokens=False).ids + [eod]
        # Every shard's manifest counts what it wrote.
        raw = [
            t
            for p in sorted((text_run / f"data/raw/{name}").glob("*.jsonl.zst"))
            for b in read_texts(p, 1 << 20)
            for t in b
        ]
        assert raw == texts


def test_rerun_gives_byte_identical_outputs(text_run, tmp_path):
    before = {t: (text_run / t).read_bytes() for t in TARGETS}
    run_snakemake(text_run, "--cores", "2", "--forceall", *TARGETS)
    assert {t: (text_run / t).read_bytes() for t in TARGETS} == before


def test_dry_run_lists_every_text_job(workdir):
    proc = run_snakemake(workdir, "-n", "--cores", "2", *TARGETS)
    for rule in ("download_text", "train_tokenizer", "tokenize", "merge_tokenized"):
        assert rule in proc.stdout


@pytest.mark.parametrize(
    "yaml_text,message",
    [
        (
            "text:\n  on_bad_record: maybe\n",
            "config key text.on_bad_record: 'maybe' is not one of ['fail', 'skip']",
        ),
        (
            "text:\n  sources:\n    bad:\n      type: local\n",
            "config key text.sources.bad: 'files' is a required property",
        ),
        ("text:\n  tokenize:\n    tokenizers: [nope]\n", "text.tokenize.tokenizers names 'nope'"),
        (
            "text:\n  sources:\n    gone:\n      type: local\n      files: missing/*.jsonl\n",
            "text.sources.gone.files: 'missing/*.jsonl' matches no file",
        ),
        ("visoin: {}\n", "('visoin' was unexpected)"),
    ],
)
def test_config_errors_name_the_key_at_plan_time(workdir, yaml_text, message):
    (workdir / "bad.yaml").write_text(yaml_text)
    proc = run_snakemake(workdir, "-n", "--configfile", "bad.yaml", check=False)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr


def test_config_readme_is_in_step_with_the_schemas():
    assert (REPO / "config" / "README.md").read_text() == config_reference(
        REPO / "workflow" / "schemas"
    ), "config/README.md is out of date: run `python -m hpcllm config-docs`"
