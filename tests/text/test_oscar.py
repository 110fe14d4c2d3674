"""OSCAR-2301 (a hub dataset with a loading script) read from its data files, offline."""

from __future__ import annotations

import pytest

from hpcllm.text.sample_corpus import write_jsonl_zst, write_oscar_mirror
from hpcllm.text.shards import ShardPolicy, write_shard
from hpcllm.text.sources import SourceError, hub_dataset
from hpcllm.text.tokenization import read_texts

DOCS = [(f"d{i}", f"Ein deutsches Dokument Nummer {i}. " * (1 + i % 5)) for i in range(30)]
OSCAR = {"type": "hub", "dataset": "oscar-corpus/OSCAR-2301", "name": "de"}


def shard(tmp_path, cfg, k, n):
    out = tmp_path / f"out/{k:04d}.jsonl.zst"
    m = write_shard("oscar_de", cfg, ShardPolicy(), k, n, out, tmp_path / f"out/{k}.json")
    return [t for b in read_texts(out, 1 << 20) for t in b], m


@pytest.fixture
def mirror(tmp_path):
    # 10 parts: the checksum file lists part_1..part_10, sorted names would put 10 second.
    return write_oscar_mirror(DOCS, tmp_path / "hub" / "oscar-corpus" / "OSCAR-2301", parts=10)


def test_oscar_is_read_from_its_parts_in_checksum_order_sharded_by_file(tmp_path, mirror):
    cfg = {**OSCAR, "mirror": str(mirror)}
    got = [shard(tmp_path, cfg, k, 3) for k in range(3)]
    # Independent reference: the documents as written, part 1 first; 10 parts over 3
    # shards are blocks of 4, 3 and 3 parts of 3 documents each.
    assert [m["documents"] for _, m in got] == [12, 9, 9]
    assert [t for texts, _ in got for t in texts] == [t for _, t in DOCS]


def test_the_mirror_root_from_the_environment_and_the_datasets_refusal(
    tmp_path, mirror, monkeypatch
):
    monkeypatch.setenv("HPCLLM_HF_MIRROR", str(tmp_path / "hub"))
    texts, m = shard(tmp_path, OSCAR, 0, 1)
    assert len(texts) == m["documents"] == 30
    # What datasets itself does with the repository: the reason for reading its files.
    import datasets

    with pytest.raises(RuntimeError, match="scripts are no longer supported"):
        datasets.load_dataset(str(mirror), name="de", split="train", streaming=True)


def test_an_unknown_language_is_named(tmp_path, mirror):
    with pytest.raises(SourceError, match=r"no xx_meta/checksum\.sha256: 'xx' is not one"):
        shard(tmp_path, {**OSCAR, "name": "xx", "mirror": str(mirror)}, 0, 1)


def test_another_script_dataset_names_the_way_out_and_data_files_reads_it(tmp_path):
    repo = tmp_path / "someorg" / "Scripted"
    (repo / "data").mkdir(parents=True)
    (repo / "Scripted.py").write_text("import datasets\n")
    write_jsonl_zst([("a", "first"), ("b", "second")], repo / "data" / "part-0.jsonl.zst")
    cfg = {"type": "hub", "dataset": "someorg/Scripted", "mirror": str(repo)}
    with pytest.raises(SourceError, match=r"ships a loading script \(Scripted\.py\).*data_files"):
        hub_dataset(cfg)
    with pytest.raises(SourceError, match="Scripted.py"):
        shard(tmp_path, cfg, 0, 1)
    texts, _ = shard(tmp_path, {**cfg, "data_files": "data/*.jsonl.zst"}, 0, 1)
    assert texts == ["first", "second"]
