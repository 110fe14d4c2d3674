"""Tokenizing straight from the sources' files (Parquet, JSON lines): the same ids and
``.bin/.idx`` bytes as an independent tokenization, and the bad-input cases of
docs/text.md for files read in place."""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import zstandard
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
from tokenizers import Tokenizer

from hpcllm.text.indexed_dataset import merge_datasets
from hpcllm.text.shards import ShardPolicy, tokenize_source_shard
from hpcllm.text.sources import BadRecord, SourceError
from hpcllm.text.tokenization import load_tokenizer

EOD = "<|endoftext|>"


def write_parquet(path, texts, row_group_size=7, extra=True):
    cols = {"text": texts}
    if extra:  # FineWeb's other columns, which the reader must not need
        cols |= {"id": [f"<urn:{i}>" for i in range(len(texts))], "url": ["u"] * len(texts)}
    pq.write_table(pa.table(cols), path, row_group_size=row_group_size)


def tokenize_source(tmp_path, cfg, shards, tok_path, policy=None, name="web"):
    policy = policy or ShardPolicy()
    tok = load_tokenizer(tok_path)
    prefixes, manifests = [], []
    for k in range(shards):
        prefix = tmp_path / f"out/{name}/{k:04d}_text_document"
        manifests.append(
            tokenize_source_shard(
                name,
                cfg,
                policy,
                k,
                shards,
                prefix,
                f"{prefix}.manifest.json",
                tok,
                EOD,
                batch_bytes=1 << 12,
            )
        )
        prefixes.append(prefix)
    merged = tmp_path / f"out/{name}_text_document"
    merge_datasets(prefixes, merged)
    return merged, manifests


def megatron_reference(tmp_path, texts, tok_path, name="ref"):
    """HF tokenizers on the texts, special tokens in text read as text (the default),
    EOD appended, written by Megatron Core's own IndexedDatasetBuilder."""
    tok = Tokenizer.from_file(str(tok_path))
    tok.encode_special_tokens = True
    eod = tok.token_to_id(EOD)
    prefix = tmp_path / name
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids + [eod]
        builder.add_document(torch.tensor(ids), [len(ids)])
    builder.finalize(f"{prefix}.idx")
    return prefix


def same_bytes(a, b):
    for ext in (".bin", ".idx"):
        assert (a.parent / f"{a.name}{ext}").read_bytes() == (
            b.parent / f"{b.name}{ext}"
        ).read_bytes()


@pytest.mark.parametrize("shards", [1, 3, 5])
def test_parquet_in_place_is_byte_identical_to_megatron_on_hf_ids(
    tmp_path, trained_tokenizer, sample_texts, edge_texts, shards
):
    texts = (edge_texts + sample_texts)[:120]
    # Two files of several row groups: 3 and 5 shards cut inside files and row groups.
    write_parquet(tmp_path / "a.parquet", texts[:50])
    write_parquet(tmp_path / "b.parquet", texts[50:], row_group_size=11)
    cfg = {"type": "local", "files": [str(tmp_path / "*.parquet")]}
    merged, manifests = tokenize_source(tmp_path, cfg, shards, trained_tokenizer)
    kept = [t for t in texts if t.strip()]
    same_bytes(merged, megatron_reference(tmp_path, kept, trained_tokenizer))
    assert sum(m["documents"] for m in manifests) == len(kept)


def test_jsonl_zst_and_gz_in_place_are_byte_identical(tmp_path, trained_tokenizer, sample_texts):
    texts = sample_texts[:90]
    lines = [json.dumps({"text": t}) + "\n" for t in texts]
    (tmp_path / "p0.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress("".join(lines[:40]).encode())
    )
    (tmp_path / "p1.jsonl.gz").write_bytes(gzip.compress("".join(lines[40:]).encode()))
    cfg = {"type": "local", "files": [str(tmp_path / "p*")]}
    merged, _ = tokenize_source(tmp_path, cfg, 3, trained_tokenizer)
    same_bytes(
        merged, megatron_reference(tmp_path, [t for t in texts if t.strip()], trained_tokenizer)
    )


@pytest.mark.parametrize("shards", [1, 4, 7])
def test_plain_jsonl_cut_by_bytes_is_byte_identical(
    tmp_path, trained_tokenizer, sample_texts, edge_texts, shards
):
    """One plain JSONL file in 4 and 7 shards, cut by bytes at line starts (issue 51):
    the merged dataset is Megatron's on the same texts, as at 1 shard."""
    texts = (edge_texts + sample_texts)[:120]
    lines = [json.dumps({"text": t}) + "\n" for t in texts]
    (tmp_path / "one.jsonl").write_text("".join(lines))
    cfg = {"type": "local", "files": [str(tmp_path / "one.jsonl")]}
    merged, manifests = tokenize_source(tmp_path, cfg, shards, trained_tokenizer)
    kept = [t for t in texts if t.strip()]
    same_bytes(merged, megatron_reference(tmp_path, kept, trained_tokenizer))
    assert sum(m["documents"] for m in manifests) == len(kept)


def test_the_shipped_hub_mirror_is_read_in_place(tmp_path, repo, trained_tokenizer):
    """The built-in fineweb source: the mirror's Parquet files through the dataset card's
    config, read with pyarrow, the same documents as pyarrow reading the files itself."""
    mirror = repo / "resources/hub_mirror/HuggingFaceFW/fineweb"
    cfg = {
        "type": "hub",
        "dataset": "HuggingFaceFW/fineweb",
        "name": "sample-10BT",
        "mirror": str(mirror),
    }
    merged, manifests = tokenize_source(tmp_path, cfg, 2, trained_tokenizer)
    texts = []
    for f in sorted((mirror / "sample/10BT").glob("*.parquet")):
        texts += pq.read_table(f, columns=["text"]).column("text").to_pylist()
    same_bytes(
        merged, megatron_reference(tmp_path, [t for t in texts if t.strip()], trained_tokenizer)
    )
    assert manifests[0]["config_name"] == "sample-10BT"


def parquet_bad(tmp_path, table):
    pq.write_table(table, tmp_path / "bad.parquet", row_group_size=2)
    return {"type": "local", "files": [str(tmp_path / "bad.parquet")]}


def invalid_utf8_strings():
    """A Parquet string column holding invalid UTF-8 in its third row (pyarrow writes it
    as is)."""
    data = b"okfine\xffbadlast"
    offsets = np.array([0, 2, 6, 10, 14], dtype=np.int32)
    return pa.StringArray.from_buffers(4, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data))


# Rows are counted from 1, as JSON lines are, and the message says so.
@pytest.mark.parametrize(
    "table,reason,where,message",
    [
        (
            pa.table({"content": ["a", "b"]}),
            "missing_text",
            "row 1 (rows counted from 1)",
            "no field 'text' (fields: content)",
        ),
        (
            pa.table({"text": [1, 2, 3]}),
            "missing_text",
            "row 1 (rows counted from 1)",
            "field 'text' is not a string (it holds int64)",
        ),
        (
            pa.table({"text": ["a", None, "c"]}),
            "missing_text",
            "row 2 (rows counted from 1)",
            "field 'text' is not a string",
        ),
        (
            pa.table({"text": invalid_utf8_strings()}),
            "invalid_utf8",
            "row 3 (rows counted from 1)",
            "invalid UTF-8 at byte 0",
        ),
        (
            pa.table({"text": invalid_utf8_strings().view(pa.binary())}),
            "invalid_utf8",
            "row 3 (rows counted from 1)",
            "invalid UTF-8 at byte 0",
        ),
        (
            pa.table({"text": ["x" * 100, "y"]}),
            "too_large",
            "row 1 (rows counted from 1)",
            "exceeds max_document_bytes=50",
        ),
    ],
)
def test_bad_parquet_records_name_file_and_row_or_are_counted(
    tmp_path, trained_tokenizer, table, reason, where, message
):
    cfg = parquet_bad(tmp_path, table)
    policy = ShardPolicy(max_document_bytes=50)
    with pytest.raises(BadRecord) as e:
        tokenize_source(tmp_path, cfg, 1, trained_tokenizer, policy)
    assert e.value.reason == reason and f"bad.parquet {where}" in str(e.value), str(e.value)
    assert message in str(e.value) and "on_bad_record: skip" in str(e.value)
    assert not list((tmp_path / "out").rglob("*.bin")), "nothing written on failure"
    skip = ShardPolicy(on_bad_record="skip", max_document_bytes=50)
    _, (m,) = tokenize_source(tmp_path / "skip", cfg, 1, trained_tokenizer, skip)
    assert m["skipped"][reason] >= 1 and f"bad.parquet {where}" in m["skipped_examples"][0]


@pytest.mark.parametrize("kind", [pa.binary(), pa.large_binary()])
def test_a_parquet_text_column_stored_as_bytes_is_read_as_utf8_text(
    tmp_path, trained_tokenizer, sample_texts, edge_texts, kind
):
    """Some writers store text as Parquet binary: the same .bin/.idx bytes as the same
    texts stored as string (the columnar path and, with a null, the row by row one)."""
    texts = (edge_texts + sample_texts)[:60]
    for name, column in (("str", pa.array(texts)), ("bin", pa.array(texts).cast(kind))):
        pq.write_table(pa.table({"text": column}), tmp_path / f"{name}.parquet", row_group_size=9)
    merged = {}
    for name in ("str", "bin"):
        cfg = {"type": "local", "files": [str(tmp_path / f"{name}.parquet")]}
        merged[name], _ = tokenize_source(tmp_path / name, cfg, 2, trained_tokenizer)
    same_bytes(merged["bin"], merged["str"])
    # A null among them sends its batch row by row: still text, still the same bytes.
    with_null = texts[:5] + [None] + texts[5:]
    for name, column in (("strn", pa.array(with_null)), ("binn", pa.array(with_null, kind))):
        pq.write_table(pa.table({"text": column}), tmp_path / f"{name}.parquet")
    skip = ShardPolicy(on_bad_record="skip")
    for name in ("strn", "binn"):
        cfg = {"type": "local", "files": [str(tmp_path / f"{name}.parquet")]}
        merged[name], (m,) = tokenize_source(tmp_path / name, cfg, 1, trained_tokenizer, skip)
        assert m["skipped"] == {"missing_text": 1}
        assert "row 6 (rows counted from 1)" in m["skipped_examples"][0]
    same_bytes(merged["binn"], merged["strn"])


@pytest.mark.parametrize("cut", [lambda b: b[: len(b) // 2], lambda b: b[:-9], lambda b: b"PAR1"])
@pytest.mark.parametrize("on_bad_record", ["fail", "skip"])
def test_truncated_parquet_is_refused_whatever_on_bad_record_says(
    tmp_path, trained_tokenizer, sample_texts, cut, on_bad_record
):
    write_parquet(tmp_path / "ok.parquet", sample_texts[:40])
    (tmp_path / "cut.parquet").write_bytes(cut((tmp_path / "ok.parquet").read_bytes()))
    cfg = {"type": "local", "files": [str(tmp_path / "cut.parquet")]}
    with pytest.raises(SourceError, match="cut.parquet: truncated or corrupt Parquet"):
        tokenize_source(tmp_path, cfg, 2, trained_tokenizer, ShardPolicy(on_bad_record))
    assert not list((tmp_path / "out").rglob("*.bin"))


def test_empty_parquet_file_is_reported_or_counted(tmp_path, trained_tokenizer):
    write_parquet(tmp_path / "a.parquet", ["one document"])
    (tmp_path / "b.parquet").write_bytes(b"")
    cfg = {"type": "local", "files": [str(tmp_path / "*.parquet")]}
    with pytest.raises(BadRecord, match="b.parquet: the file is empty"):
        tokenize_source(tmp_path, cfg, 1, trained_tokenizer)
    _, (m,) = tokenize_source(tmp_path, cfg, 1, trained_tokenizer, ShardPolicy("skip"))
    assert m["skipped"] == {"empty_file": 1} and m["documents"] == 1


def test_bad_jsonl_in_place_names_file_and_line_and_truncated_zst_is_refused(
    tmp_path, trained_tokenizer
):
    (tmp_path / "a.jsonl").write_text('{"text": "good"}\n{"text": \n{"body": "x"}\n')
    cfg = {"type": "local", "files": [str(tmp_path / "a.jsonl")]}
    with pytest.raises(BadRecord, match=r"a.jsonl:2: malformed JSON"):
        tokenize_source(tmp_path, cfg, 1, trained_tokenizer)
    _, (m,) = tokenize_source(tmp_path / "s", cfg, 1, trained_tokenizer, ShardPolicy("skip"))
    assert m["skipped"] == {"malformed_json": 1, "missing_text": 1} and m["documents"] == 1
    data = zstandard.ZstdCompressor().compress(b'{"text": "a"}\n' * 2000)
    (tmp_path / "cut.jsonl.zst").write_bytes(data[: len(data) // 2])
    cfg = {"type": "local", "files": [str(tmp_path / "cut.jsonl.zst")]}
    with pytest.raises(Exception, match="cut.jsonl.zst: truncated or corrupt zst"):
        tokenize_source(tmp_path / "c", cfg, 1, trained_tokenizer, ShardPolicy("skip"))


def test_the_cards_files_are_the_ones_datasets_resolves(repo):
    """The files of a mirror's config, read from its card without importing datasets,
    are datasets' own resolution, in its order."""
    import datasets

    from hpcllm.text.sources import hub_data_files

    mirror = str(repo / "resources/hub_mirror/HuggingFaceFW/fineweb")
    cfg = {"type": "hub", "dataset": "HuggingFaceFW/fineweb", "name": "sample-10BT"}
    builder = datasets.load_dataset_builder(mirror, name="sample-10BT")
    assert hub_data_files(cfg, mirror) == list(builder.config.data_files["train"])


@pytest.fixture
def progress_lines(monkeypatch):
    """The progress lines, one after every batch."""
    import hpcllm.progress

    monkeypatch.setattr(hpcllm.progress, "INTERVAL_S", 0.0)
    lines: list[str] = []
    monkeypatch.setattr(hpcllm.progress.log, "info", lines.append)
    return lines


def shard_totals(lines: list[str]) -> dict[int, list[int | None]]:
    """Each shard's totals, line by line (None: a line without one)."""
    totals: dict[int, list[int | None]] = {}
    for line in lines:
        m = re.match(r"tokenize (\d{4})_text_document: [\d,]+( of ([\d,]+))? documents", line)
        assert m, line
        totals.setdefault(int(m[1]), []).append(int(m[3].replace(",", "")) if m[3] else None)
    return totals


@pytest.mark.parametrize("shards,totals", [(2, [30, 20]), (3, [17, 17, 16])])
def test_a_parquet_shard_reports_its_rows_from_the_footers(
    tmp_path, trained_tokenizer, sample_texts, progress_lines, shards, totals
):
    """Issue 40: without max_documents the progress lines had no total and no ETA. A
    shard of whole Parquet files takes its total from their footers (2 shards: a file
    each), a shard of a block of rows its block (3 shards of 50 rows)."""
    texts = [t for t in sample_texts if t.strip()][:50]
    write_parquet(tmp_path / "a.parquet", texts[:30])
    write_parquet(tmp_path / "b.parquet", texts[30:], row_group_size=11)
    cfg = {"type": "local", "files": [str(tmp_path / "*.parquet")]}
    tokenize_source(tmp_path, cfg, shards, trained_tokenizer)
    found = shard_totals(progress_lines)
    assert found == {k: [n] * len(found[k]) for k, n in enumerate(totals)}, progress_lines
    assert any("ETA" in line for line in progress_lines), progress_lines


def test_a_jsonl_shard_estimates_its_documents_from_the_bytes_read(
    tmp_path, trained_tokenizer, sample_texts, progress_lines, monkeypatch
):
    """JSON lines would need a full read to count: the total is estimated from the
    position in the file (here every 4 lines), exact once the file is read."""
    import hpcllm.text.sources

    monkeypatch.setattr(hpcllm.text.sources, "POSITION_EVERY", 4)
    texts = [t for t in sample_texts if t.strip()][:40]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cfg = {"type": "local", "files": [str(tmp_path / "a.jsonl")]}
    tokenize_source(tmp_path, cfg, 1, trained_tokenizer)
    (totals,) = shard_totals(progress_lines).values()
    assert None not in totals and totals[-1] == 40, progress_lines
    assert progress_lines[-1].startswith("tokenize 0000_text_document: 40 of 40 documents")
    assert any("ETA" in line for line in progress_lines), progress_lines


def test_a_compressed_files_position_is_in_its_compressed_bytes(tmp_path):
    """What a JSON lines file's position is measured in: its bytes on disk."""
    from hpcllm.text.compressed import disk_position, open_binary

    data = b"".join(b'{"text": "%d"}\n' % i for i in range(20000))
    for name, packed in (
        ("a.jsonl.gz", gzip.compress(data)),
        ("a.jsonl.zst", zstandard.ZstdCompressor().compress(data)),
    ):
        (tmp_path / name).write_bytes(packed)
        with open_binary(tmp_path / name) as f:
            f.readline()
            assert 0 < disk_position(f) <= len(packed) < len(data)
            f.read()
            assert disk_position(f) == len(packed)
