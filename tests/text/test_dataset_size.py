"""An empty (or too small) merged dataset is an error naming the source and why."""

from __future__ import annotations

import pytest
from text_helpers import write_jsonl

from hpcllm.text.shards import ShardPolicy, TooFewDocuments, check_source_size, write_shard


def shard(tmp_path, k, n, records, raw_lines=None):
    write_jsonl(tmp_path / f"in{k}.jsonl", records, raw_lines)
    manifest = tmp_path / f"{k:04d}.manifest.json"
    write_shard(
        "web",
        {"type": "local", "files": f"in{k}.jsonl"},
        ShardPolicy(on_bad_record="skip"),
        0,
        1,
        tmp_path / f"{k:04d}.jsonl.zst",
        manifest,
        base=tmp_path,
    )
    return manifest


def test_a_source_whose_records_are_all_skipped_or_empty_is_an_error(tmp_path):
    manifests = [
        shard(tmp_path, 0, 1, [{"text": "  "}, {"body": "no text field"}], {2: b"{broken"}),
        shard(tmp_path, 1, 1, [{"text": ""}], {1: b"\xff\xfe not utf-8"}),
    ]
    with pytest.raises(TooFewDocuments) as e:
        check_source_size("web", manifests, 1)
    msg = str(e.value)
    assert "source 'web': its 2 shard(s) hold 0 documents, fewer than min_documents: 1" in msg
    assert "invalid_utf8: 1, malformed_json: 1, missing_text: 1" in msg
    assert "empty documents dropped: 2" in msg and "in0.jsonl:2" in msg


def test_one_empty_shard_is_fine_and_the_minimum_is_configurable(tmp_path):
    manifests = [shard(tmp_path, 0, 1, [{"text": ""}]), shard(tmp_path, 1, 1, [{"text": "a"}])]
    assert check_source_size("web", manifests, 1) == 1
    with pytest.raises(TooFewDocuments, match="hold 1 documents, fewer than min_documents: 2"):
        check_source_size("web", manifests, 2)


def test_skip_counts_of_one_reason_add_up_over_the_shards(tmp_path):
    manifests = [
        shard(tmp_path, k, 1, [{"body": "no text"}] * (k + 1) + [{"text": ""}]) for k in range(3)
    ]
    with pytest.raises(TooFewDocuments) as e:
        check_source_size("web", manifests, 1)
    assert "Skipped records by reason: missing_text: 6;" in str(e.value)
    assert "empty documents dropped: 3" in str(e.value)
