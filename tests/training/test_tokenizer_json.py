"""The tokenizers users bring: a ``tokenizer.json`` alone, of any model Hugging Face
``tokenizers`` loads, end to end (issue 22, item 6).

Real tokenizers trained here with ``tokenizers`` on the shipped sample text: a Unigram
(SentencePiece-style: NFKC, Metaspace, ``</s>`` as end-of-document token, as many
European models), a WordPiece, and a byte-level BPE saved as ``tokenizer.json`` only (no
GPT-2 vocab/merges files). Each tokenizes to HF's ids (read back with Megatron Core's
reader); the folder the engines read is what Megatron Core's own HuggingFaceTokenizer
builds (ids, size, EOD, the index cache key); the workflow takes the Unigram through
tokenize, merge, the index cache and the torch engine's training on the CPU, and plans
Megatron's command line with HuggingFaceTokenizer and that folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from megatron.core.datasets.indexed_dataset import IndexedDataset
from support import REPO, hang_guard, make_workdir, megatron_hf_tokenizer, run_snakemake

from hpcllm.text.sample_corpus import write_jsonl_zst
from hpcllm.text.tokenization import TokenizerError, load_tokenizer, read_texts, tokenize_shard
from hpcllm.text.tokenizers_config import (
    engine_files,
    engine_vocabulary,
    plan_problem,
    tokenizer_for,
    write_hf_folder,
)
from hpcllm.training.engines.cache import MegatronTokenizerKey

EDGE = [
    "Größe, Straße; été, où? Ελληνικά, Русский, 日本語の文章",
    "Emoji 🚀🇪🇺 and\ttabs\nnewlines  spaces",
    "</s> and <|endoftext|> and [SEP] written inside text",
    "",
]


def english() -> list[str]:
    return [t for b in read_texts(REPO / "resources/sample_text/en.jsonl.zst", 1 << 20) for t in b]


def train(kind: str, out: Path, texts: list[str]) -> tuple[Path, str]:
    """A small real tokenizer of ``kind`` saved as ``out/tokenizer.json`` alone; returns
    the file and its end-of-document token."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=500,
            special_tokens=["<unk>", "<s>", "</s>"],
            unk_token="<unk>",
            show_progress=False,
        )
        eod = "</s>"
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer()
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(
            vocab_size=500, special_tokens=["[UNK]", "[SEP]"], show_progress=False
        )
        eod = "[SEP]"
    else:  # byte-level BPE, tokenizer.json only
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=600,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        eod = "<|endoftext|>"
    tok.train_from_iterator(texts, trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    return out / "tokenizer.json", eod


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return english()


@pytest.fixture(scope="module")
def tokenizers_made(tmp_path_factory, corpus) -> dict[str, tuple[Path, str]]:
    root = tmp_path_factory.mktemp("given")
    return {k: train(k, root / k, corpus) for k in ("unigram", "wordpiece", "bytelevel")}


def hf_ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("kind", ["unigram", "wordpiece", "bytelevel"])
def test_a_tokenizer_json_tokenizes_to_hf_ids_that_megatron_core_reads(
    tmp_path, tokenizers_made, corpus, kind
):
    path, eod_token = tokenizers_made[kind]
    tok = tokenizer_for({"type": "files", "eod_token": eod_token}, [str(path)])
    texts = [*corpus[:20], *EDGE]
    shard = tmp_path / "shard.jsonl.zst"
    write_jsonl_zst(((str(i), t) for i, t in enumerate(texts)), shard)
    stats = tokenize_shard(shard, tmp_path / "out_text_document", tok, eod_token, batch_bytes=4096)
    # gigatoken encodes BPE only; the others fall back to HF tokenizers by themselves
    assert stats.encoder == ("gigatoken" if kind == "bytelevel" else "hf")
    ds = IndexedDataset(str(tmp_path / "out_text_document"))
    eod = tok.token_to_id(eod_token)
    assert len(ds) == len(texts)
    # special tokens inside text are encoded as text (special_tokens_in_text: text)
    reference = load_tokenizer(path)
    reference.encode_special_tokens = True
    for doc, text in zip(ds, texts, strict=True):
        assert doc.tolist() == hf_ids(reference, text) + [eod]


@pytest.mark.parametrize("kind", ["unigram", "wordpiece", "bytelevel"])
def test_the_engine_folder_is_what_megatron_cores_hugging_face_tokenizer_builds(
    tmp_path, tokenizers_made, corpus, kind
):
    path, eod_token = tokenizers_made[kind]
    cfg = {"type": "files", "tokenizer_json": str(path), "eod_token": eod_token}
    folder = write_hf_folder(cfg, str(path), tmp_path / "hf")
    files = (str(folder / "tokenizer.json"), str(folder / "tokenizer_config.json"))
    size, eod = engine_vocabulary(files, eod_token)
    tok = load_tokenizer(path)
    assert (size, eod) == (tok.get_vocab_size(with_added_tokens=True), tok.token_to_id(eod_token))
    # Megatron-LM's build_tokenizer for --tokenizer-type HuggingFaceTokenizer --tokenizer-model
    real = megatron_hf_tokenizer(folder)
    assert (real.vocab_size, real.eod) == (size, eod)
    key = MegatronTokenizerKey(str(folder), size, eod)
    assert key.unique_identifiers == real.unique_identifiers
    for text in [*corpus[:3], *EDGE[:2]]:
        assert real.tokenize(text) == hf_ids(tok, text)
    # a folder whose eos_token is not the documents' end-of-document token is refused
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<unk>"}))
    with pytest.raises(TokenizerError, match=r"names eos_token '<unk>', but the documents end"):
        engine_vocabulary(files, eod_token)


def test_an_end_of_document_token_the_tokenizer_lacks_is_refused_at_plan_time(tokenizers_made):
    path, _ = tokenizers_made["unigram"]
    cfg = {"type": "files", "tokenizer_json": str(path), "eod_token": "<|endoftext|>"}
    problem = plan_problem("euro", cfg)
    assert problem.startswith(
        "text.tokenizers.euro: the end-of-document token eod_token '<|endoftext|>' is not in"
    )
    assert "Unigram, special tokens: <unk>, <s>, </s>" in problem
    assert problem.endswith(
        "set text.tokenizers.euro.eod_token to its end-of-document token (e.g. eod_token: '</s>')"
    )
    assert plan_problem("euro", {**cfg, "eod_token": "</s>"}) is None
    # not there yet: the job that reads it checks
    assert plan_problem("euro", {**cfg, "tokenizer_json": "nowhere/tokenizer.json"}) is None
    trained = {"type": "train", "vocab_size": 300, "special_tokens": ["<|endoftext|>"]}
    problem = plan_problem("bpe", {**trained, "eod_token": "</s>"})
    assert "eod_token '</s>' is not one of its special_tokens (<|endoftext|>)" in problem
    assert "add it to text.tokenizers.bpe.special_tokens (first)" in problem
    assert plan_problem("bpe", {**trained, "eod_token": "<|endoftext|>"}) is None


def test_gpt2_files_beside_a_tokenizer_json_must_agree_with_it(tmp_path, tokenizers_made):
    """tokenizer_json wins (tokenize and the engines read it); vocab and merges files named
    beside it are checked against it at plan time."""
    from snakemake.utils import validate

    path, eod = tokenizers_made["bytelevel"]
    tok = load_tokenizer(path)
    vocab, merges = tok.model.save(str(tmp_path))
    cfg = {"type": "files", "tokenizer_json": str(path), "vocab_file": vocab,
           "merges_file": merges, "eod_token": eod}  # fmt: skip
    source = {"type": "local", "files": "x.jsonl"}
    text = {
        "sources": {"s": source},
        "tokenizers": {"given": cfg},
        "tokenize": {"tokenizers": ["given"]},
    }
    validate(text, str(REPO / "workflow/schemas/text.schema.yaml"))  # all three accepted
    assert plan_problem("given", cfg) is None
    assert engine_files("given", cfg) == (
        "data/tokenizers/given/hf/tokenizer.json",
        "data/tokenizers/given/hf/tokenizer_config.json",
    )
    # Megatron gets HuggingFaceTokenizer with that folder, at plan time too (before
    # tokenizer_folder has written it)
    from hpcllm.training.engines.command import megatron_tokenizer_model

    assert megatron_tokenizer_model(engine_files("given", cfg)) == "data/tokenizers/given/hf"
    other, _ = tokenizers_made["wordpiece"]
    other_vocab = tmp_path / "other.json"
    other_vocab.write_text(json.dumps(load_tokenizer(other).get_vocab()))
    problem = plan_problem("given", {**cfg, "vocab_file": str(other_vocab)})
    assert (
        f"text.tokenizers.given: vocab_file {other_vocab} and tokenizer_json {path} disagree"
        in (problem)
    )
    lone = {"type": "files", "tokenizer_json": str(path), "vocab_file": vocab}
    with pytest.raises(Exception, match="merges_file"):
        validate(
            {**text, "tokenizers": {"given": lone}}, str(REPO / "workflow/schemas/text.schema.yaml")
        )


@pytest.mark.workflow
def test_a_unigram_tokenizer_json_goes_through_the_workflow_and_trains(
    tmp_path, tokenizers_made, monkeypatch
):
    """tokenize -> merge -> tokenizer_folder -> prepare_data_cache -> the torch engine's
    segment, on the CPU, with a Unigram given as tokenizer.json only; then the megatron
    engine's plan of the same experiment: HuggingFaceTokenizer with the folder, and its
    index cache keyed as Megatron Core's own tokenizer of that folder."""
    from snakemake.utils import validate

    from hpcllm.clusters import load_cluster
    from hpcllm.training.engines.cache import build_index_cache
    from hpcllm.training.engines.command import engine_command
    from hpcllm.training.plan.experiment import Paths, prepare_experiment

    work = make_workdir(tmp_path / "work")
    path, eod_token = tokenizers_made["unigram"]
    experiment = {
        "engine": "torch",
        "preset": "tiny",
        "data": {"tokenizer": "euro", "sources": {"sample_en": 1.0}, "split": "90,10,0"},
        "layout": {"nodes": 1, "procs_per_node": 1},
        "segments": 1,
        "iterations_per_segment": 4,
        "optim": {"warmup_iters": 1},
    }
    override = {
        "text": {
            "tokenizers": {
                "euro": {"type": "files", "tokenizer_json": str(path), "eod_token": eod_token}
            },
            "tokenize": {"tokenizers": ["sample_bpe", "euro"]},
        },
        "training": {"run": ["tiny_euro"], "experiments": {"tiny_euro": experiment}},
    }
    (work / "euro.yaml").write_text(yaml.safe_dump(override))
    # about 40 s on a quiet 2-core machine: text stage, index cache, 4 CPU iterations
    run_snakemake(
        work,
        "results/train/tiny_euro/seg1.json",
        "--profile",
        "profiles/local",
        "--configfile",
        "euro.yaml",
        timeout=hang_guard(60),
    )
    tok = load_tokenizer(path)
    tok.encode_special_tokens = True
    eod = tok.token_to_id(eod_token)
    # The source read in place (resources/sample_text/en.jsonl.zst), empty documents dropped.
    raw = [REPO / "resources/sample_text/en.jsonl.zst"]
    texts = [t for shard in raw for batch in read_texts(shard, 1 << 20) for t in batch if t.strip()]
    ds = IndexedDataset(str(work / "data/tokenized/euro/sample_en_text_document"))
    assert len(ds) == len(texts) > 0
    for doc, text in zip(ds, texts, strict=True):
        assert doc.tolist() == hf_ids(tok, text) + [eod]
    folder = work / "data/tokenizers/euro/hf"
    assert json.loads((folder / "tokenizer_config.json").read_text())["eos_token"] == "</s>"
    assert (folder / "tokenizer.json").read_bytes() == path.read_bytes()
    launch = (work / "logs/train_segment/tiny_euro/seg1.engine.sh").read_text()
    assert "--tokenizer-model data/tokenizers/euro/hf" in launch
    assert "--vocab-file" not in launch
    engine_log = (work / "logs/train_segment/tiny_euro/seg1.engine.log").read_text()
    assert "iteration        4/       4 |" in engine_log, engine_log[-3000:]
    record = json.loads((work / "results/train/tiny_euro/seg1.json").read_text())
    assert record["last_iteration"] == 4, record

    # The megatron engine, planned for a GPU cluster from the same config
    config = yaml.safe_load((REPO / "config/examples/local.yaml").read_text())
    text = {**config["text"], **override["text"]}
    training = {"experiments": {"tiny_euro": {**experiment, "engine": "megatron"}}}
    for section, cfg in (("text", text), ("training", training)):  # defaults filled in
        validate(cfg, str(REPO / f"workflow/schemas/{section}.schema.yaml"))
    monkeypatch.chdir(work)
    prepared = prepare_experiment(
        "tiny_euro", training["experiments"]["tiny_euro"], text, load_cluster("juwels")
    )
    paths = Paths("checkpoints/m", "seg1.json", "seg1.engine.log", "data/index_cache/m", "tb")
    argv = engine_command(
        prepared.experiment, prepared.layout, prepared.blend, prepared.tokenizer_files,
        paths, 1, None, eod_token=prepared.eod_token,
    )  # fmt: skip
    at = argv.index("--tokenizer-type")
    assert argv[at : at + 4] == [
        "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "data/tokenizers/euro/hf"
    ]  # fmt: skip
    assert "--vocab-file" not in argv and "--merge-file" not in argv
    built = build_index_cache(prepared, paths.data_cache, "data/index_cache/m.json")
    assert all(built["built"][:2]) and built["files"]
    real = megatron_hf_tokenizer("data/tokenizers/euro/hf")
    assert real.eod == eod and real.vocab_size == tok.get_vocab_size(with_added_tokens=True)
