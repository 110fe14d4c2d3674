"""download_text: sources, sharding, limits and every kind of bad input."""

from __future__ import annotations

import json

import pytest
from text_helpers import write_jsonl

from hpcllm.text.sample_corpus import write_hub_mirror
from hpcllm.text.shards import ShardPolicy, write_shard
from hpcllm.text.sources import BadRecord, SourceError, resolve_local_files
from hpcllm.text.tokenization import read_texts


def local(files, **kw):
    return {"type": "local", "files": files, **kw}


def run_shard(tmp_path, cfg, policy=None, shard=0, num_shards=1, name="src"):
    policy = policy or ShardPolicy()
    out = tmp_path / "out" / f"{shard:04d}.jsonl.zst"
    manifest = tmp_path / "out" / f"{shard:04d}.manifest.json"
    m = write_shard(name, cfg, policy, shard, num_shards, out, manifest, base=tmp_path)
    assert json.loads(manifest.read_text()) == m
    texts = [t for b in read_texts(out, 1 << 20) for t in b]
    return texts, m


def docs(n, prefix="doc"):
    return [{"id": f"{prefix}{i}", "text": f"{prefix} number {i}"} for i in range(n)]


def test_shards_of_one_file_are_contiguous_blocks_in_source_order(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", docs(10))
    cfg = local("a.jsonl")
    got = [run_shard(tmp_path, cfg, shard=k, num_shards=3)[0] for k in range(3)]
    assert [len(g) for g in got] == [4, 3, 3]
    assert [t for g in got for t in g] == [f"doc number {i}" for i in range(10)]
    # Rerun: byte-identical files.
    first = (tmp_path / "out" / "0002.jsonl.zst").read_bytes()
    run_shard(tmp_path, cfg, shard=2, num_shards=3)
    assert (tmp_path / "out" / "0002.jsonl.zst").read_bytes() == first


def test_files_are_dealt_to_shards_when_there_are_enough(tmp_path):
    for i in range(4):
        write_jsonl(tmp_path / f"f{i}.jsonl", docs(2, prefix=f"f{i}_"))
    texts, m = run_shard(tmp_path, local("f*.jsonl"), shard=1, num_shards=2)
    assert texts == ["f2_ number 0", "f2_ number 1", "f3_ number 0", "f3_ number 1"]
    assert m["documents"] == 4


def test_as_many_files_as_shards_gives_each_shard_one_whole_file(tmp_path):
    """The boundary of dealing files: N files for N shards is one file per shard (each job
    opens only its own), even when the files differ in size."""
    write_jsonl(tmp_path / "f0.jsonl", docs(3, prefix="f0_"))
    write_jsonl(tmp_path / "f1.jsonl", docs(1, prefix="f1_"))
    got = [run_shard(tmp_path, local("f*.jsonl"), shard=k, num_shards=2)[0] for k in range(2)]
    assert got == [[f"f0_ number {i}" for i in range(3)], ["f1_ number 0"]]


def test_the_manifest_keeps_the_first_20_skipped_places_and_counts_them_all(tmp_path):
    """docs/text.md: skipped records by reason with the first 20 places."""
    bad = {2 * i + 1: b'{"id": 1, "text": "unterminated' for i in range(25)}
    write_jsonl(tmp_path / "a.jsonl", docs(30), raw_lines=bad)
    texts, m = run_shard(tmp_path, local("a.jsonl"), ShardPolicy(on_bad_record="skip"))
    assert len(texts) == 30
    assert m["skipped"] == {"malformed_json": 25} and m["skipped_total"] == 25
    assert len(m["skipped_examples"]) == 20
    assert [e.split(":")[1] for e in m["skipped_examples"]] == [str(2 * i + 1) for i in range(20)]


def test_limits_are_split_over_shards(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", docs(100))
    cfg = local("a.jsonl", max_documents=7)
    from hpcllm.text.shards import source_policy

    counts = [
        run_shard(tmp_path, cfg, source_policy(cfg, {}, k, 3), k, 3)[1]["documents"]
        for k in range(3)
    ]
    assert counts == [3, 2, 2]
    cfg = local("a.jsonl", max_bytes=60)  # "doc number 12" is 13 bytes
    texts, m = run_shard(tmp_path, cfg, source_policy(cfg, {}, 0, 1))
    assert m["bytes"] <= 60 and len(texts) == 5


@pytest.mark.parametrize(
    "raw,reason,message",
    [
        (b'{"id": 1, "text": "unterminated', "malformed_json", "malformed JSON"),
        (b'{"id": 1, "body": "no text field"}', "missing_text", "no field 'text'"),
        (b'{"id": 1, "text": "bad \xff\xfe bytes"}', "invalid_utf8", "invalid UTF-8"),
        (b'["not", "an", "object"]', "malformed_json", "a JSON line must hold an object"),
        (b'{"id": 1, "text": 42}', "missing_text", "field 'text' is not a string"),
    ],
)
def test_bad_records_fail_with_file_and_line_or_are_skipped_and_counted(
    tmp_path, raw, reason, message
):
    write_jsonl(tmp_path / "a.jsonl", docs(5), raw_lines={4: raw})
    with pytest.raises(BadRecord, match=rf"a\.jsonl:4: {message}.*on_bad_record: skip"):
        run_shard(tmp_path, local("a.jsonl"))
    assert not list((tmp_path / "out").glob("0000.*")), "no output after a failure"
    texts, m = run_shard(tmp_path, local("a.jsonl"), ShardPolicy(on_bad_record="skip"))
    assert len(texts) == 5
    assert m["skipped"] == {reason: 1} and m["skipped_total"] == 1
    assert "a.jsonl:4" in m["skipped_examples"][0]


def test_empty_documents_are_dropped_and_counted(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": ""}, {"text": "  \n"}, {"text": "real"}])
    texts, m = run_shard(tmp_path, local("a.jsonl"))
    assert texts == ["real"] and m["empty_documents"] == 2


def test_huge_document_is_a_bad_record(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x" * 5000}, {"text": "small"}])
    with pytest.raises(BadRecord, match=r"a\.jsonl:1: document of 5000 bytes exceeds"):
        run_shard(tmp_path, local("a.jsonl"), ShardPolicy(max_document_bytes=4096))
    texts, m = run_shard(
        tmp_path, local("a.jsonl"), ShardPolicy(max_document_bytes=4096, on_bad_record="skip")
    )
    assert texts == ["small"] and m["skipped"] == {"too_large": 1}


def test_a_document_of_exactly_max_document_bytes_is_accepted(tmp_path):
    """config/README.md: max_document_bytes is the largest document accepted."""
    write_jsonl(tmp_path / "a.jsonl", [{"text": "é" * 2048}, {"text": "x" * 4097}])
    texts, m = run_shard(
        tmp_path, local("a.jsonl"), ShardPolicy(max_document_bytes=4096, on_bad_record="skip")
    )
    assert texts == ["é" * 2048] and m["skipped"] == {"too_large": 1}


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(BadRecord, match=r"empty\.jsonl: the file is empty"):
        run_shard(tmp_path, local("empty.jsonl"))
    texts, m = run_shard(tmp_path, local("empty.jsonl"), ShardPolicy(on_bad_record="skip"))
    assert texts == [] and m["skipped"] == {"empty_file": 1}
    with pytest.raises(
        SourceError, match=r"text\.sources\.web\.files: 'nope/\*\.jsonl' matches no file"
    ):
        resolve_local_files("web", local("nope/*.jsonl"), tmp_path)


def test_compressed_parquet_and_text_inputs(tmp_path):
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.jsonl.gz").write_bytes(
        gzip.compress(b'{"text": "gz one"}\n{"text": "gz two"}\n')
    )
    assert run_shard(tmp_path, local("a.jsonl.gz"))[0] == ["gz one", "gz two"]
    pq.write_table(pa.table({"content": ["pq one", "pq two"]}), tmp_path / "b.parquet")
    assert run_shard(tmp_path, local("b.parquet", text_field="content"))[0] == ["pq one", "pq two"]
    (tmp_path / "c.txt").write_text("first paragraph\nstill first\n\nsecond paragraph\n")
    texts, _ = run_shard(tmp_path, local("c.txt"))
    assert [t.strip() for t in texts] == ["first paragraph\nstill first", "second paragraph"]
    with pytest.raises(SourceError, match="cannot tell the file format"):
        (tmp_path / "d.csv").write_text("x")
        run_shard(tmp_path, local("d.csv"))


def test_hub_source_reads_a_local_mirror_offline(tmp_path, monkeypatch):
    """The hub code path (datasets streaming, config name, shards) on a mirror, offline."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    records = [(f"id{i}", f"web page {i}") for i in range(9)]
    root = tmp_path / "mirror"
    write_hub_mirror(records, root / "HuggingFaceFW" / "fineweb", files=3)
    cfg = {"type": "hub", "dataset": "HuggingFaceFW/fineweb", "name": "sample-10BT"}
    monkeypatch.setenv("HPCLLM_HF_MIRROR", str(root))
    shards = [run_shard(tmp_path, cfg, shard=k, num_shards=3)[0] for k in range(3)]
    assert [t for s in shards for t in s] == [t for _, t in records]  # source order
    assert shards[0] == ["web page 0", "web page 1", "web page 2"]  # file-level sharding
    two = [run_shard(tmp_path, cfg, shard=k, num_shards=2)[0] for k in range(2)]
    assert [t for s in two for t in s] == [t for _, t in records]
    four = [run_shard(tmp_path, cfg, shard=k, num_shards=4)[0] for k in range(4)]
    assert [len(s) for s in four] == [3, 2, 2, 2]  # more shards than files: counted blocks
    assert [t for s in four for t in s] == [t for _, t in records]
    texts, m = run_shard(tmp_path, cfg, num_shards=1)
    assert texts == [t for _, t in records] and m["documents"] == 9
    assert m["revision"].startswith("local mirror")
    monkeypatch.setenv("HPCLLM_HF_MIRROR", str(tmp_path / "elsewhere"))
    with pytest.raises(SourceError, match="mirror .* does not exist"):
        run_shard(tmp_path, cfg)
