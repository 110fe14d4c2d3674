"""tokenize: ids identical to HF tokenizers, Megatron-readable output, bad tokenizers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import orjson
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset
from support import hang_guard

from hpcllm.text import tokenization
from hpcllm.text.sample_corpus import write_jsonl_zst
from hpcllm.text.tokenization import (
    TokenizerError,
    encode_each,
    gigatoken_encoder,
    hf_encoder,
    load_tokenizer,
    make_encoder,
    read_texts,
    tokenize_shard,
    tokenizer_from_gpt2_files,
    with_eod,
    with_special_handling,
)
from hpcllm.text.tokenizers_config import tokenizer_for

EOD = "<|endoftext|>"


def hf_ids(tok, text, special_tokens_in_text="text"):
    """The reference: HF tokenizers with special tokens in text read as configured."""
    return with_special_handling(tok, special_tokens_in_text).encode(text).ids


@pytest.mark.parametrize("special_tokens_in_text", ["text", "special"])
@pytest.mark.parametrize("path", ["each document", "encode_batch"])
def test_gigatoken_gives_hf_ids_on_many_scripts(
    trained_tokenizer, edge_texts, sample_texts, special_tokens_in_text, path, monkeypatch
):
    """Both of gigatoken's paths: document by document (one thread, or a small batch) and
    encode_batch on its pool (read back through awkward)."""
    tok = with_special_handling(load_tokenizer(trained_tokenizer), special_tokens_in_text)
    texts = edge_texts + sample_texts
    calls = []
    monkeypatch.setattr(tokenization, "encode_each", lambda *a: calls.append(1) or encode_each(*a))
    if path == "encode_batch":
        monkeypatch.setattr(tokenization, "EACH_DOCUMENT_CHARS", 0)
    flat, lengths = gigatoken_encoder(tok, threads=1 if path == "each document" else 2).encode(
        texts
    )
    assert len(calls) == (path == "each document")
    assert flat.dtype == np.uint32 and lengths.dtype == np.int64
    ref_flat, ref_lengths = hf_encoder(tok).encode(texts)
    np.testing.assert_array_equal(lengths, ref_lengths)
    np.testing.assert_array_equal(flat, ref_flat)
    # And per document, against the plain single-text API.
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for i, text in enumerate(edge_texts):
        assert flat[offsets[i] : offsets[i + 1]].tolist() == hf_ids(
            tok, text, special_tokens_in_text
        )


def test_one_document_at_a_time_beside_encode_batch_in_another_thread(
    trained_tokenizer, sample_texts
):
    """The stage checks a window of batch n on its thread while batch n + 1 is encoded on
    another: gigatoken's encode must not run during its encode_batch ("Already
    borrowed"); the small call waits or takes encode_batch, with the same ids."""
    import threading

    enc = gigatoken_encoder(load_tokenizer(trained_tokenizer), threads=2)
    big, small = sample_texts * 40, sample_texts[:3]
    assert sum(map(len, big)) >= tokenization.EACH_DOCUMENT_CHARS > sum(map(len, small))
    want_small = hf_encoder(load_tokenizer(trained_tokenizer)).encode(small)
    results = {}
    worker = threading.Thread(target=lambda: results.update(big=enc.encode(big)))
    worker.start()
    calls = 0
    while worker.is_alive() or not calls:
        got = enc.encode(small)
        np.testing.assert_array_equal(got[0], want_small[0])
        calls += 1
    worker.join()
    flat, lengths = results["big"]
    assert len(lengths) == len(big) and int(lengths.sum()) == len(flat)


def test_gpt2_style_files_give_the_same_ids_as_tokenizer_json(trained_tokenizer, edge_texts):
    d = trained_tokenizer.parent
    from_json = load_tokenizer(trained_tokenizer, eod_token=EOD)
    from_files = tokenizer_for(
        {"type": "files", "eod_token": EOD}, [str(d / "vocab.json"), str(d / "merges.txt")]
    )
    for text in edge_texts:
        assert hf_ids(from_files, text) == hf_ids(from_json, text)
    assert from_files.token_to_id(EOD) == from_json.token_to_id(EOD)


def tokenize_and_read(tmp_path, tok, texts, **kw):
    shard = tmp_path / "shard.jsonl.zst"
    write_jsonl_zst(((str(i), t) for i, t in enumerate(texts)), shard)
    stats = tokenize_shard(shard, tmp_path / "out_text_document", tok, EOD, **kw)
    return stats, IndexedDataset(str(tmp_path / "out_text_document"))


@pytest.mark.parametrize("encoder", ["auto", "hf"])
def test_tokenized_shard_read_by_megatron_equals_hf_ids_plus_eod(
    tmp_path, trained_tokenizer, edge_texts, encoder
):
    tok = load_tokenizer(trained_tokenizer, eod_token=EOD)
    eod = tok.token_to_id(EOD)
    # Small batches so that many batches (and the prefetch thread) are exercised.
    stats, ds = tokenize_and_read(tmp_path, tok, edge_texts, encoder=encoder, batch_bytes=1024)
    assert stats.encoder == ("gigatoken" if encoder == "auto" else "hf")
    assert len(ds) == len(edge_texts) == stats.documents
    assert stats.tokens == sum(len(doc) for doc in ds)  # the figure the log's tokens/s uses
    for doc, text in zip(ds, edge_texts, strict=True):
        assert doc.tolist() == hf_ids(tok, text) + [eod]
    assert ds.index.dtype == np.uint16


def test_without_append_eod(tmp_path, trained_tokenizer, edge_texts):
    tok = load_tokenizer(trained_tokenizer, eod_token=EOD)
    _, ds = tokenize_and_read(tmp_path, tok, edge_texts[:3], append_eod=False)
    assert [d.tolist() for d in ds] == [hf_ids(tok, t) for t in edge_texts[:3]]


def test_auto_falls_back_to_hf_when_gigatoken_cannot_load_or_differs(
    trained_tokenizer, monkeypatch
):
    from tokenizers import Tokenizer, models, pre_tokenizers

    word_level = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    assert make_encoder(word_level, "auto", ["a b c"]).name == "hf"
    with pytest.raises(TokenizerError, match="gigatoken cannot load"):
        make_encoder(word_level, "gigatoken")

    tok = load_tokenizer(trained_tokenizer)
    import hpcllm.text.tokenization as t

    real = t.gigatoken_encoder

    def off_by_one(tk):
        enc = real(tk)
        inner = enc._encode
        enc._encode = lambda texts: (inner(texts)[0] + 1, inner(texts)[1])
        return enc

    monkeypatch.setattr(t, "gigatoken_encoder", off_by_one)
    assert make_encoder(tok, "auto", ["some text"]).name == "hf"
    with pytest.raises(TokenizerError, match="other ids"):
        make_encoder(tok, "gigatoken", ["some text"])


def test_tokenizer_that_does_not_match_the_config(tmp_path, trained_tokenizer):
    size = load_tokenizer(trained_tokenizer).get_vocab_size()
    with pytest.raises(
        TokenizerError,
        match=rf"has a vocabulary of {size} tokens but the config says vocab_size: 50257",
    ):
        tokenizer_for(
            {"type": "files", "vocab_size": 50257, "eod_token": EOD}, str(trained_tokenizer)
        )
    with pytest.raises(TokenizerError, match="'</s>' is not in the vocabulary"):
        tokenizer_for({"type": "files", "eod_token": "</s>"}, str(trained_tokenizer))
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: not a loadable tokenizer"):
        load_tokenizer(bad)
    with pytest.raises(TokenizerError, match="does not exist"):
        tokenizer_from_gpt2_files(tmp_path / "vocab.json", tmp_path / "merges.txt")


def test_reading_is_streamed_in_bounded_batches(tmp_path):
    shard = tmp_path / "s.jsonl.zst"
    write_jsonl_zst(((str(i), "x" * 1000) for i in range(500)), shard)
    sizes = [sum(len(t) for t in b) for b in read_texts(shard, 16_000)]
    assert len(sizes) > 25 and max(sizes) <= 17_000


def test_a_corrupt_shard_is_named(tmp_path, trained_tokenizer):
    shard = tmp_path / "s.jsonl.zst"
    write_jsonl_zst([("0", "fine")], shard)
    import zstandard

    shard.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "ok"}\nnot json\n'))
    with pytest.raises(ValueError, match=r"s\.jsonl\.zst:2: not a JSONL shard of"):
        tokenize_shard(shard, tmp_path / "o", load_tokenizer(trained_tokenizer), EOD)
    assert not list(tmp_path.glob("o.*"))


KILL_SCRIPT = """
import sys
from hpcllm.text.tokenization import load_tokenizer, tokenize_shard
tok = load_tokenizer(sys.argv[1])
tokenize_shard(sys.argv[2], sys.argv[3], tok, "<|endoftext|>", encoder="hf", batch_bytes=4096)
"""


def test_killed_tokenize_leaves_no_complete_looking_output_and_rerun_is_identical(
    tmp_path, trained_tokenizer, sample_texts
):
    shard = tmp_path / "big.jsonl.zst"
    write_jsonl_zst(((str(i), t) for i, t in enumerate(sample_texts * 4)), shard)
    out = tmp_path / "out" / "0000_text_document"
    args = [sys.executable, "-c", KILL_SCRIPT, str(trained_tokenizer), str(shard), str(out)]
    proc = subprocess.Popen(args)
    partial = out.parent / "0000_text_document.bin.incomplete"
    deadline = time.monotonic() + hang_guard(2)  # writing starts within ~2 s quiet
    while not (partial.exists() and partial.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert partial.exists(), "the job was killed while writing"
    assert not out.with_suffix(".bin").exists() and not out.with_suffix(".idx").exists()
    subprocess.run(args, check=True)
    assert not partial.exists()
    rerun = (out.with_suffix(".bin").read_bytes(), out.with_suffix(".idx").read_bytes())
    tokenize_shard(shard, tmp_path / "ref", load_tokenizer(trained_tokenizer), EOD, encoder="hf")
    assert rerun == ((tmp_path / "ref.bin").read_bytes(), (tmp_path / "ref.idx").read_bytes())
    assert json.dumps(len(IndexedDataset(str(out)))) == str(len(sample_texts) * 4)


SPECIALS = ["<|endoftext|>", "<pad>", "[MASK]", "<|im_start|>", "<s>"]


@pytest.fixture(scope="module")
def many_specials_tokenizer(tmp_path_factory, sample_texts):
    from hpcllm.text.tokenizer_train import train_bpe

    d = tmp_path_factory.mktemp("specials")
    shard = d / "corpus.jsonl.zst"
    write_jsonl_zst(((str(i), t) for i, t in enumerate(sample_texts[:300])), shard)
    return train_bpe([shard], d / "bpe", vocab_size=600, special_tokens=SPECIALS)


@pytest.mark.parametrize("encoder", ["auto", "hf"])
def test_special_tokens_inside_documents_are_text_by_default(
    tmp_path, many_specials_tokenizer, encoder
):
    tok = load_tokenizer(many_specials_tokenizer, eod_token=EOD)
    special_ids = {tok.token_to_id(t) for t in SPECIALS}
    texts = [f"web text {t} more" for t in SPECIALS] + ["".join(SPECIALS), "a<s>b[MASK]</s>"]
    stats, ds = tokenize_and_read(tmp_path, tok, texts, encoder=encoder)
    assert stats.encoder == ("gigatoken" if encoder == "auto" else "hf")
    for doc, text in zip(ds, texts, strict=True):
        ids = doc.tolist()
        # The end-of-document id only where the workflow appends it; no other special id.
        assert ids[-1] == tok.token_to_id(EOD) and not special_ids & set(ids[:-1]), text
        assert ids[:-1] == hf_ids(tok, text, "text")
        assert tok.decode(ids[:-1]) == text  # the literal text survives, byte for byte


@pytest.mark.parametrize("encoder", ["auto", "hf"])
def test_special_tokens_in_text_special_keeps_hf_and_megatron_ids(
    tmp_path, many_specials_tokenizer, encoder
):
    tok = load_tokenizer(many_specials_tokenizer, eod_token=EOD)
    texts = [f"web text {t} more" for t in SPECIALS]
    stats, ds = tokenize_and_read(
        tmp_path, tok, texts, encoder=encoder, special_tokens_in_text="special"
    )
    assert stats.encoder == ("gigatoken" if encoder == "auto" else "hf")
    for doc, text, special in zip(ds, texts, SPECIALS, strict=True):
        # HF's own default (and Megatron-LM's preprocess_data.py): the token's id.
        assert doc.tolist()[:-1] == tok.encode(text, add_special_tokens=False).ids
        assert tok.token_to_id(special) in doc.tolist()[:-1]


def test_the_probe_covers_every_special_token_without_a_given_probe(
    many_specials_tokenizer, monkeypatch
):
    import hpcllm.text.tokenization as t

    tok = with_special_handling(load_tokenizer(many_specials_tokenizer), "text")
    real = t.gigatoken_encoder

    def wrong_on_masks(tk):
        enc = real(tk)
        inner = enc._encode

        def encode(texts):
            flat, lengths = inner(texts)
            return (flat + 1, lengths) if any("[MASK]" in x for x in texts) else (flat, lengths)

        enc._encode = encode
        return enc

    monkeypatch.setattr(t, "gigatoken_encoder", wrong_on_masks)
    assert make_encoder(tok, "auto").name == "hf"


def test_a_difference_after_the_first_batch_stops_the_job(tmp_path, trained_tokenizer, monkeypatch):
    import hpcllm.text.tokenization as t

    real = t.gigatoken_encoder

    def wrong_on_late_text(tk):
        enc = real(tk)
        inner = enc._encode

        def encode(texts):
            flat, lengths = inner(texts)
            return (flat + 1, lengths) if any("late" in x for x in texts) else (flat, lengths)

        enc._encode = encode
        return enc

    monkeypatch.setattr(t, "gigatoken_encoder", wrong_on_late_text)
    texts = [f"early document {i} " * 20 for i in range(50)] + ["late document " * 20] * 5
    with pytest.raises(TokenizerError, match=r"gave other ids than tokenizers .*encoder: hf"):
        tokenize_and_read(tmp_path, load_tokenizer(trained_tokenizer), texts, batch_bytes=1024)
    assert not list(tmp_path.glob("out_text_document.*"))


def test_a_difference_in_the_second_batch_stops_the_job(tmp_path, trained_tokenizer, monkeypatch):
    """Every batch after the first (the probe) checks one document: the second one too."""
    import hpcllm.text.tokenization as t

    real = t.gigatoken_encoder

    def wrong_on_late_text(tk):
        enc = real(tk)
        inner = enc._encode

        def encode(texts):
            flat, lengths = inner(texts)
            return (flat + 1, lengths) if any("late" in x for x in texts) else (flat, lengths)

        enc._encode = encode
        return enc

    monkeypatch.setattr(t, "gigatoken_encoder", wrong_on_late_text)
    texts = ["early document " * 100, "late document " * 20, "late again " * 20]
    shard = tmp_path / "shard.jsonl.zst"
    write_jsonl_zst(((str(i), x) for i, x in enumerate(texts)), shard)
    batches = list(read_texts(shard, 1024))
    assert [len(b) for b in batches] == [1, 2]  # the late documents are the second batch
    with pytest.raises(TokenizerError, match=r"other ids than tokenizers for the document after 1"):
        tokenize_shard(
            shard,
            tmp_path / "out_text_document",
            load_tokenizer(trained_tokenizer),
            EOD,
            batch_bytes=1024,
        )
    assert not list(tmp_path.glob("out_text_document.*"))


def test_the_check_is_a_bounded_share_of_the_text_spread_over_it():
    """The documents checked against tokenizers: at most the fraction plus the reserve,
    in every batch, at every position of a batch (not only its first document)."""
    from hpcllm.text.tokenization import SampledCheck

    check = SampledCheck(fraction=0.01, reserve=2000)
    batches = [[f"d{b}-{i} " + "w" * 190 for i in range(500)] for b in range(40)]
    picks = [check.pick(batch) for batch in batches]
    assert all(picked and window is None for picked, window in picks)  # every batch
    positions = {i for picked, _ in picks for i in picked}
    assert len(positions) > 100 and max(positions) > 400  # spread over the batch
    chars = sum(len(t) for b in batches for t in b)
    assert check.seen_chars == chars
    assert 0.01 * chars - 200 <= check.checked_chars <= 0.01 * chars + 2000
    # Documents longer than the allowance: a window of one of them instead.
    check = SampledCheck(fraction=0.01, reserve=0)
    assert check.pick(["x" * 100_000]) == ([], None)  # 1,000 characters allowed: nothing
    picked, window = check.pick(["y" * 100_000] * 9)  # 10,000 allowed: a 4,096 window
    assert picked == [] and window == "y" * 4096


def per_document_wrong(real, marker):
    """gigatoken with the ids of every document holding ``marker`` off by one."""

    def make(tk):
        enc = real(tk)
        inner = enc._encode

        def encode(texts):
            flat, lengths = inner(texts)
            flat = flat.copy()
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            for i, text in enumerate(texts):
                if marker in text:
                    flat[offsets[i] : offsets[i + 1]] += 1
            return flat, lengths

        enc._encode = encode
        return enc

    return make


def test_a_wrong_document_inside_a_late_batch_stops_the_job(
    tmp_path, trained_tokenizer, monkeypatch
):
    """Past the shard's reserve only the fraction is checked, documents picked at random:
    wrong ids on every fourth document, never the first of a batch, still stop the job."""
    import hpcllm.text.tokenization as t

    monkeypatch.setattr(t, "gigatoken_encoder", per_document_wrong(t.gigatoken_encoder, "late"))
    texts = [
        f"document {i:05d} " + ("late " if i >= 1200 and i % 4 == 3 else "fine ") + "text " * 36
        for i in range(2400)
    ]  # 490 k characters: the first 1200 documents use up the 64 Ki reserve
    shard = tmp_path / "shard.jsonl.zst"
    write_jsonl_zst(((f"{i:05d}", x) for i, x in enumerate(texts)), shard)
    line = len(orjson.dumps({"id": "00000", "text": texts[0]})) + 1
    batches = list(read_texts(shard, 40 * line - 10))
    assert {len(b) for b in batches} == {40}  # so no batch starts with a wrong document
    assert not any("late" in b[0] for b in batches)
    with pytest.raises(TokenizerError, match=r"other ids than tokenizers for the document after"):
        tokenize_shard(
            shard,
            tmp_path / "out_text_document",
            load_tokenizer(trained_tokenizer),
            EOD,
            batch_bytes=40 * line - 10,
            check_fraction=0.1,
        )
    assert not list(tmp_path.glob("out_text_document.*"))


def test_a_huge_document_is_encoded_in_pieces_with_the_same_ids(
    tmp_path, trained_tokenizer, sample_texts
):
    from hpcllm.text.tokenization import pieces, splits_at_whitespace

    tok = load_tokenizer(trained_tokenizer, eod_token=EOD)
    assert splits_at_whitespace(tok)
    huge = "\n\n".join(sample_texts[:20]) + "  \n \t end"
    cut = pieces(huge, 1000)
    assert "".join(cut) == huge and len(cut) > len(huge) // 1000
    assert max(len(p) for p in cut) <= 1000
    texts = ["short one", huge, "short two " * 50, huge[:50_000][::-1]]
    for encoder in ("auto", "hf"):
        _, ds = tokenize_and_read(
            tmp_path, tok, texts, encoder=encoder, piece_chars=1000, batch_bytes=8000
        )
        for doc, text in zip(ds, texts, strict=True):
            assert doc.tolist() == hf_ids(tok, text) + [tok.token_to_id(EOD)]


def test_pieces_only_where_they_keep_the_ids():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from hpcllm.text.tokenization import pieces, splits_at_whitespace

    meta = Tokenizer(models.BPE())
    meta.pre_tokenizer = pre_tokenizers.Metaspace()
    assert not splits_at_whitespace(meta)
    byte_level = Tokenizer(models.BPE())
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert splits_at_whitespace(byte_level)
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    assert not splits_at_whitespace(byte_level)
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    assert not splits_at_whitespace(byte_level)
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    byte_level.normalizer = normalizers.NFC()
    assert not splits_at_whitespace(byte_level)
    # A run without whitespace longer than a piece stays whole.
    assert pieces("x" * 50 + " y" * 10, 20) == ["x" * 50] + [" y" * 10]


def test_tokenize_prints_progress_with_the_manifests_total(
    tmp_path, trained_tokenizer, sample_texts, monkeypatch, caplog
):
    """The shard's manifest gives the total: every line says done of total with a share,
    the last one 100% (progress lines at every batch here; 30 s by default)."""
    import hpcllm.progress
    from hpcllm.text.shards import manifest_documents

    shard = tmp_path / "0000.jsonl.zst"
    write_jsonl_zst(((str(i), t) for i, t in enumerate(sample_texts)), shard)
    (tmp_path / "0000.manifest.json").write_text(json.dumps({"documents": len(sample_texts)}))
    assert manifest_documents(shard) == len(sample_texts)
    assert manifest_documents(tmp_path / "none.jsonl.zst") is None
    monkeypatch.setattr(hpcllm.progress, "INTERVAL_S", 0.0)
    caplog.set_level("INFO", logger="hpcllm.progress")
    tok = load_tokenizer(trained_tokenizer, eod_token=EOD)
    tokenize_shard(
        shard, tmp_path / "out" / "0000_text_document", tok, EOD, batch_bytes=4096,
        total_documents=manifest_documents(shard),
    )  # fmt: skip
    lines = [r.getMessage() for r in caplog.records if r.name == "hpcllm.progress"]
    total = f"of {len(sample_texts):,} documents"
    assert len(lines) >= 3 and all(total in line for line in lines), lines
    # no rate on the first line (measured from the first batch on), then an ETA
    assert (
        "ETA" not in lines[0]
        and "ETA" in lines[1]
        and lines[-1].startswith(
            f"tokenize 0000_text_document: {len(sample_texts):,} {total} (100.0%)"
        )
    )


def test_with_eod_writes_the_datasets_dtype_and_refuses_ids_that_do_not_fit():
    flat = np.array([5, 6, 7, 65_535], dtype=np.uint32)
    out, lengths = with_eod(flat, np.array([2, 0, 2]), 9, np.uint16)
    assert out.dtype == np.uint16 and out.tolist() == [5, 6, 9, 9, 7, 65_535, 9]
    assert lengths.tolist() == [3, 1, 3]
    # A conversion wrapping 70,000 or -1 into uint16 would write a wrong id silently.
    for bad in (np.array([70_000], dtype=np.uint32), np.array([-1], dtype=np.int64)):
        with pytest.raises(ValueError, match="do not fit the dataset dtype uint16"):
            with_eod(bad, np.array([1]), 9, np.uint16)
