"""Parquet rows handed to the tokenizer as Arrow arrays (no Python string per document):
the same kept documents, counts and ids as reading them one by one."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hpcllm.text.shards import ShardCounts, ShardPolicy, shard_batches, shard_texts
from hpcllm.text.sources import BadRecord, TextRun, shard_documents
from hpcllm.text.tokenization import (
    awkward_strings,
    gigatoken_encoder,
    hf_encoder,
    is_arrow,
    load_tokenizer,
)

# Documents the policy must treat exactly as row by row: empty, whitespace only (ASCII,
# Unicode, the separators Python's isspace counts), text after leading whitespace.
AWKWARD = [
    "",
    "   ",
    "\u00a0\u2003\u3000",
    "\x1c\x1d\x1e\x1f",
    "\u0085\u2028\u2029",
    "  text after spaces",
    "\u00a0nbsp then text",
    "\u200b",  # zero width space: not whitespace to Python, kept
    "\t\n\r\x0b\x0c",
    "é",
]


def corpus(sample_texts):
    texts = list(sample_texts[:150])
    for k, t in enumerate(AWKWARD):
        texts.insert(7 * k + 3, t)
    return texts


def write_files(tmp_path, texts):
    """Three files of several row groups; the last with an id column, like FineWeb."""
    cuts = [0, 40, 110, len(texts)]
    for i in range(3):
        part = texts[cuts[i] : cuts[i + 1]]
        cols = {"text": part}
        if i == 2:
            cols["id"] = [f"<urn:{k}>" for k in range(len(part))]
        pq.write_table(pa.table(cols), tmp_path / f"p{i}.parquet", row_group_size=9)
    return {"type": "local", "files": [str(tmp_path / "p*.parquet")]}


def by_rows(cfg, policy, shard, shards, base):
    counts = ShardCounts()
    texts = [d.text for d in shard_texts("s", cfg, policy, shard, shards, counts, base)]
    return texts, counts


def by_batches(cfg, policy, shard, shards, base, batch_bytes=300):
    counts = ShardCounts()
    texts, arrow = [], 0
    for batch in shard_batches("s", cfg, policy, shard, shards, counts, batch_bytes, base):
        arrow += is_arrow(batch)
        texts += batch.to_pylist() if is_arrow(batch) else batch
    return texts, counts, arrow


POLICIES = [
    ShardPolicy(),
    ShardPolicy(max_documents=17),
    ShardPolicy(max_documents=0),
    ShardPolicy(max_bytes=5000),
    ShardPolicy(max_bytes=5000, max_documents=3),
    ShardPolicy(max_bytes=1),
]


@pytest.mark.parametrize("shards", [1, 2, 5])
@pytest.mark.parametrize("policy", POLICIES, ids=repr)
def test_arrow_batches_keep_what_rows_keep(tmp_path, sample_texts, policy, shards):
    cfg = write_files(tmp_path, corpus(sample_texts))
    for shard in range(shards):
        want, want_counts = by_rows(cfg, policy, shard, shards, tmp_path)
        got, got_counts, arrow = by_batches(cfg, policy, shard, shards, tmp_path)
        assert got == want, (shard, len(got), len(want))
        assert (got_counts.documents, got_counts.bytes, got_counts.empty) == (
            want_counts.documents,
            want_counts.bytes,
            want_counts.empty,
        )
        if want:
            assert arrow, "the clean rows came as Arrow arrays"


def test_the_documents_read_are_the_files_rows_and_limits_hold(tmp_path, sample_texts):
    """Not only equal to the row path: equal to pyarrow's rows with Python's rules."""
    texts = corpus(sample_texts)
    cfg = write_files(tmp_path, texts)
    kept = [t for t in texts if t and not t.isspace()]
    got, counts, _ = by_batches(cfg, ShardPolicy(), 0, 1, tmp_path)
    assert got == kept and counts.empty == len(texts) - len(kept)
    got, counts, _ = by_batches(cfg, ShardPolicy(max_documents=17), 0, 1, tmp_path)
    assert got == kept[:17] and counts.documents == 17
    got, counts, _ = by_batches(cfg, ShardPolicy(max_documents=0), 0, 1, tmp_path)
    assert got == [] and counts.documents == 0, "a share of the limit of 0 keeps nothing"


def test_a_bad_row_sends_its_batch_row_by_row(tmp_path):
    """A null, invalid UTF-8 or too large document: that batch goes row by row (which names
    the row); the clean batches stay columnar."""
    texts = ["good one", None, "good two", "x" * 100] + [f"clean {k}" for k in range(20)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "b.parquet", row_group_size=4)
    cfg = {"type": "local", "files": [str(tmp_path / "b.parquet")]}
    items = list(shard_documents("s", cfg, 0, 1, tmp_path, columnar=True))
    assert [type(i).__name__ for i in items[:4]] == ["Document", "BadRecord", "Document"] + [
        "Document"
    ]
    assert all(isinstance(i, TextRun) for i in items[4:]) and len(items) == 9
    policy = ShardPolicy(on_bad_record="skip", max_document_bytes=50)
    got, counts, _ = by_batches(cfg, policy, 0, 1, tmp_path)
    assert got == ["good one", "good two"] + texts[4:]
    assert counts.skipped.counts == {"missing_text": 1, "too_large": 1}
    with pytest.raises(
        BadRecord, match=r"b.parquet row 2 \(rows counted from 1\): field 'text' is not"
    ):
        by_batches(cfg, ShardPolicy(max_document_bytes=50), 0, 1, tmp_path)


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_gigatoken_reads_arrow_slices_as_it_reads_strings(trained_tokenizer, edge_texts, kind):
    """Slices (a non-zero first offset), both offset widths, taken rows: the ids of the
    same texts as Python strings, and HF's."""
    tok = load_tokenizer(trained_tokenizer)
    gt, hf = gigatoken_encoder(tok), hf_encoder(tok)
    arr = pa.array(edge_texts * 3, kind)
    for texts in (arr, arr.slice(5, 31), arr.take(pa.array([3, 0, 17, 17, 42]))):
        flat, lengths = gt.encode(texts)
        want = hf.encode(texts.to_pylist())
        assert np.array_equal(lengths, want[1]) and np.array_equal(flat, want[0])
        assert len(awkward_strings(texts)) == len(texts)


def test_the_whitespace_lead_bytes_are_pythons():
    from hpcllm.text.arrow_texts import SPACE_LEAD_BYTES

    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    assert set(SPACE_LEAD_BYTES) == {c.encode()[0] for c in spaces}


def test_blank_is_pythons_isspace_on_every_whitespace_character():
    from hpcllm.text.arrow_texts import blank, utf8_offsets

    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    texts = ["", "x", " x", "x ", "\u200b", "“quoted”", "日本", "§"] + spaces
    texts += [s * 3 for s in spaces] + [s + "y" for s in spaces]
    arr = pa.array(texts).slice(1)
    assert blank(arr, utf8_offsets(arr)).tolist() == [not t or t.isspace() for t in texts[1:]]
