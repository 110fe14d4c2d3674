"""Compressed and odd inputs: read to their end marker or an error naming the file."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma

import pytest
import zstandard
from text_helpers import write_jsonl

from hpcllm.text.compressed import CorruptInput, open_binary
from hpcllm.text.shards import ShardPolicy, write_shard
from hpcllm.text.tokenization import read_texts

LINES = b"".join(
    json.dumps({"id": str(i), "text": f"document {i} " * 20}).encode() + b"\n" for i in range(200)
)


def shard_texts(tmp_path, files, policy=None):
    policy = policy or ShardPolicy()
    out = tmp_path / "out.jsonl.zst"
    m = write_shard(
        "src",
        {"type": "local", "files": files},
        policy,
        0,
        1,
        out,
        tmp_path / "m.json",
        base=tmp_path,
    )
    return [t for b in read_texts(out, 1 << 20) for t in b], m


def two_frames() -> bytes:
    half = len(LINES) // 2
    cut = LINES.index(b"\n", half) + 1
    c = zstandard.ZstdCompressor()
    return c.compress(LINES[:cut]) + c.compress(LINES[cut:])


@pytest.mark.parametrize(
    "name,data",
    [
        ("cut_in_second_frame.jsonl.zst", two_frames()[:-40]),
        ("one_frame_cut_in_half.jsonl.zst", zstandard.ZstdCompressor().compress(LINES)[:600]),
        ("cut.jsonl.gz", gzip.compress(LINES, mtime=0)[:-30]),
        ("cut.jsonl.xz", lzma.compress(LINES)[:-30]),
        ("cut.jsonl.bz2", bz2.compress(LINES)[:-30]),
    ],
    ids=lambda value: value if isinstance(value, str) else "",  # the file name, not the bytes
)
@pytest.mark.parametrize("on_bad_record", ["fail", "skip"])
def test_a_truncated_compressed_file_fails_naming_it(tmp_path, name, data, on_bad_record):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(CorruptInput, match=rf"{name}: truncated or corrupt"):
        shard_texts(tmp_path, name, ShardPolicy(on_bad_record=on_bad_record))
    assert not (tmp_path / "out.jsonl.zst").exists()


def test_a_complete_multi_frame_zstd_file_is_read_whole(tmp_path):
    (tmp_path / "ok.jsonl.zst").write_bytes(two_frames())
    texts, m = shard_texts(tmp_path, "ok.jsonl.zst")
    assert len(texts) == m["documents"] == 200
    with open_binary(tmp_path / "ok.jsonl.zst") as f:
        assert f.read() == LINES


@pytest.mark.parametrize(
    "compress", [gzip.compress, zstandard.ZstdCompressor().compress, lzma.compress, bz2.compress]
)
def test_compressed_bytes_under_a_plain_name_are_read_by_their_magic_bytes(tmp_path, compress):
    (tmp_path / "mislabelled.jsonl").write_bytes(compress(LINES))
    texts, m = shard_texts(tmp_path, "mislabelled.jsonl")
    assert m["documents"] == 200 and texts[0].startswith("document 0 ")


def test_plain_bytes_under_a_compressed_name_are_named(tmp_path):
    (tmp_path / "plain.jsonl.zst").write_bytes(LINES)
    with pytest.raises(CorruptInput, match=r"plain\.jsonl\.zst: named \.zst but does not start"):
        shard_texts(tmp_path, "plain.jsonl.zst")


def test_a_byte_order_mark_keeps_the_first_record(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + LINES[:500].rsplit(b"\n", 1)[0] + b"\n")
    texts, m = shard_texts(tmp_path, "bom.jsonl")
    assert texts[0].startswith("document 0 ") and m["skipped_total"] == 0
    # Also when the file has more records than shards use (the counted path).
    path2 = tmp_path / "bom2.jsonl"
    path2.write_bytes(b"\xef\xbb\xbf" + LINES)
    from hpcllm.text.sources import shard_documents

    got = [
        d.text
        for k in range(3)
        for d in shard_documents("s", {"type": "local", "files": "bom2.jsonl"}, k, 3, base=tmp_path)
    ]
    assert len(got) == 200 and got[0].startswith("document 0 ")


def test_a_literal_path_with_glob_characters(tmp_path):
    write_jsonl(tmp_path / "crawl[2024].jsonl", [{"text": "bracketed"}])
    texts, _ = shard_texts(tmp_path, "crawl[2024].jsonl")
    assert texts == ["bracketed"]
