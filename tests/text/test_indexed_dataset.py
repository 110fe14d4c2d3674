"""Our writer and merger against Megatron Core's own builder and reader."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder

from hpcllm.text.indexed_dataset import (
    IndexedDatasetError,
    IndexedDatasetWriter,
    check_dataset,
    merge_datasets,
    optimal_dtype,
)

RNG = np.random.default_rng(0)


def random_docs(n: int, vocab: int) -> list[np.ndarray]:
    return [RNG.integers(0, vocab, RNG.integers(1, 300)) for _ in range(n)]


def write_ours(prefix, docs, dtype) -> None:
    with IndexedDatasetWriter(prefix, dtype) as w:
        # Two batches, to cover several add_documents calls.
        half = len(docs) // 2
        for part in (docs[:half], docs[half:]):
            if part:
                w.add_documents(np.concatenate(part), [len(d) for d in part])


def write_megatron(prefix, docs, dtype) -> None:
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.dtype(dtype).type)
    for d in docs:
        builder.add_document(torch.tensor(d), [len(d)])
    builder.finalize(f"{prefix}.idx")


# 65_499 and 65_500: the two sides of Megatron's uint16/int32 boundary
@pytest.mark.parametrize("vocab", [50_000, 65_499, 65_500, 100_000])
def test_writer_is_byte_identical_to_megatron_builder(tmp_path, vocab):
    docs = random_docs(57, vocab)
    dtype = optimal_dtype(vocab)
    assert dtype == DType.optimal_dtype(vocab)
    write_ours(tmp_path / "ours", docs, dtype)
    write_megatron(tmp_path / "ref", docs, dtype)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"ours{ext}").read_bytes() == (tmp_path / f"ref{ext}").read_bytes()
    ds = IndexedDataset(str(tmp_path / "ours"))
    assert len(ds) == len(docs)
    for got, want in zip(ds, docs, strict=True):
        np.testing.assert_array_equal(got, want)


def test_merge_equals_megatron_add_index(tmp_path):
    parts = [random_docs(n, 30_000) for n in (5, 0, 13, 1)]
    dtype = optimal_dtype(30_000)
    prefixes = []
    for i, docs in enumerate(parts):
        write_ours(tmp_path / f"part{i}", docs, dtype)
        prefixes.append(str(tmp_path / f"part{i}"))
    index = merge_datasets(prefixes, tmp_path / "merged")
    builder = IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=dtype.type)
    for p in prefixes:
        builder.add_index(p)
    builder.finalize(str(tmp_path / "ref.idx"))
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"merged{ext}").read_bytes() == (tmp_path / f"ref{ext}").read_bytes()
    all_docs = [d for docs in parts for d in docs]
    assert len(index.sequence_lengths) == len(all_docs)
    ds = IndexedDataset(str(tmp_path / "merged"))
    for got, want in zip(ds, all_docs, strict=True):
        np.testing.assert_array_equal(got, want)


def test_merge_refuses_mixed_dtypes_and_corrupt_inputs(tmp_path):
    write_ours(tmp_path / "a", random_docs(3, 100), np.uint16)
    write_ours(tmp_path / "b", random_docs(3, 100), np.int32)
    with pytest.raises(IndexedDatasetError, match="different token dtypes"):
        merge_datasets([tmp_path / "a", tmp_path / "b"], tmp_path / "m")
    assert not (tmp_path / "m.bin").exists() and not (tmp_path / "m.idx").exists()
    # A truncated .bin is named, and nothing is written.
    with open(tmp_path / "a.bin", "r+b") as f:
        f.truncate(4)
    with pytest.raises(IndexedDatasetError, match=r"a\.bin: holds 4 bytes"):
        merge_datasets([tmp_path / "a"], tmp_path / "m")
    assert not list(tmp_path.glob("m.*"))
    (tmp_path / "b.idx").write_bytes(b"garbage")
    with pytest.raises(IndexedDatasetError, match="bad magic"):
        check_dataset(tmp_path / "b")


def test_failed_writer_leaves_nothing_that_looks_complete(tmp_path):
    with pytest.raises(RuntimeError):
        with IndexedDatasetWriter(tmp_path / "x", np.uint16) as w:
            w.add_documents(np.arange(10), [10])
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_writer_rejects_ids_that_do_not_fit(tmp_path):
    with pytest.raises(ValueError, match="do not fit"):
        with IndexedDatasetWriter(tmp_path / "x", np.uint16) as w:
            w.add_documents(np.array([70_000]), [1])
    assert list(tmp_path.iterdir()) == []


def test_a_bin_or_idx_with_bytes_beyond_what_the_index_describes_is_refused(tmp_path):
    """check_dataset wants exactly the tokens the index describes: trailing bytes (a .bin
    appended to, an .idx of another build) mean the pair is not what it claims."""
    write_ours(tmp_path / "a", random_docs(4, 100), np.uint16)
    assert check_dataset(tmp_path / "a").num_tokens * 2 == (tmp_path / "a.bin").stat().st_size
    with open(tmp_path / "a.bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(IndexedDatasetError, match=r"a\.bin: holds \d+ bytes but .*describes"):
        check_dataset(tmp_path / "a")
    write_ours(tmp_path / "b", random_docs(4, 100), np.uint16)
    with open(tmp_path / "b.idx", "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(IndexedDatasetError, match=r"b\.idx: truncated or corrupt index"):
        check_dataset(tmp_path / "b")
