"""Shards of plain JSON lines files, fewer files than shards, are cut by bytes at line
starts: every line in exactly one shard, in source order, with its own line number, and
no shard counts the records of the whole source (issue 51, item 10)."""

from __future__ import annotations

import json

import pytest

from hpcllm.text import sources
from hpcllm.text.sources import Document, ShardSize, shard_documents


def write_lines(path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


def sample_lines(n: int, prefix: str) -> list[bytes]:
    """Lines of very different lengths, a blank line, a bad line, a BOM on the first."""
    lines = []
    for i in range(n):
        text = f"{prefix} document {i} " + "word " * ((i * 37) % 90)
        lines.append(json.dumps({"text": text, "id": f"{prefix}{i}"}).encode() + b"\n")
    lines[0] = b"\xef\xbb\xbf" + lines[0]
    lines[5] = b"   \n"
    lines[9] = b"{not json\n"
    lines[-1] = lines[-1].rstrip(b"\n")  # no newline at the end
    return lines


def read(cfg: dict, shard: int, num_shards: int, size: ShardSize | None = None) -> list:
    return [
        (x.where, x.id if isinstance(x, Document) else x.reason)
        for x in shard_documents("web", cfg, shard, num_shards, size=size)
    ]


@pytest.fixture
def no_counting(monkeypatch):
    def refuse(path, cfg):
        raise AssertionError(f"counted the records of {path}")

    monkeypatch.setattr(sources, "_count_records", refuse)


@pytest.mark.parametrize("files", [1, 2])
@pytest.mark.parametrize("num_shards", [2, 3, 4, 7, 60])
def test_byte_blocks_are_the_source_in_order(tmp_path, no_counting, files, num_shards):
    paths = []
    for f in range(files):
        path = tmp_path / f"part{f}.jsonl"
        write_lines(path, sample_lines(40, f"f{f}"))
        paths.append(str(path))
    cfg = {"type": "local", "files": paths}
    whole = [
        (x.where, x.id if isinstance(x, Document) else x.reason)
        for p in paths
        for x in sources._local_file_records(p, cfg)
    ]
    assert (f"{paths[0]}:10", "malformed_json") in whole
    assert (f"{paths[0]}:1", "f00") in whole  # the BOM removed
    # as many shards as files or fewer: whole files per shard (not cut by bytes); the
    # records are the same either way
    blocks = [read(cfg, k, num_shards) for k in range(num_shards)]
    assert [item for b in blocks for item in b] == whole
    if num_shards > files:
        assert sum(1 for b in blocks if b) >= min(num_shards, 20)  # the lines are spread


def test_a_shard_reports_its_block_bytes(tmp_path, no_counting):
    path = tmp_path / "one.jsonl"
    write_lines(path, sample_lines(200, "x"))
    cfg = {"type": "local", "files": [str(path)]}
    size = ShardSize()
    items = read(cfg, 1, 4, size)
    total = path.stat().st_size
    assert size.file_bytes in (total // 4, total // 4 + 1)
    assert size.bytes_done == size.file_bytes
    assert items and all(isinstance(i[1], str) for i in items)


def test_compressed_and_empty_files_are_still_counted(tmp_path):
    """A compressed file has no byte offsets to seek to, and an empty file is one bad
    record: both keep the record count (the same blocks as before)."""
    import gzip

    lines = sample_lines(30, "z")
    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(gzip.compress(b"".join(lines)))
    empty = tmp_path / "b.jsonl"
    empty.write_bytes(b"")
    for paths in ([str(gz)], [str(tmp_path / "c.jsonl"), str(empty)]):
        if not (tmp_path / "c.jsonl").exists():
            write_lines(tmp_path / "c.jsonl", lines)
        cfg = {"type": "local", "files": paths}
        assert not sources._splits_by_bytes(paths, cfg)
        blocks = [read(cfg, k, 3) for k in range(3)]
        sizes = [len(b) for b in blocks]
        assert max(sizes) - min(sizes) <= 1  # blocks of records
        assert [i for b in blocks for i in b][-1] == (paths[-1], "empty_file") or len(paths) == 1


@pytest.mark.parametrize("chunk", [7, 64, 1 << 24])
def test_the_newlines_before_a_block_are_counted_in_the_mapped_file(tmp_path, chunk):
    path = tmp_path / "one.jsonl"
    write_lines(path, sample_lines(50, "n"))
    data = path.read_bytes()
    for pos in (1, 6, 7, 8, 63, 64, 65, len(data) // 2, len(data) - 1, len(data), len(data) + 9):
        assert sources._newlines_before(str(path), pos, chunk) == data[:pos].count(b"\n"), pos
