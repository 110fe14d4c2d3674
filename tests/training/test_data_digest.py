"""Issue 40 item 1: what a model was trained on is recorded (a digest of its datasets), and
the results page says when the exported model is older than the data there now."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hpcllm.results_page import older_than_data
from hpcllm.text.indexed_dataset import IndexedDatasetWriter
from hpcllm.training.plan.data import data_digest


def dataset(prefix: Path, documents: list[list[int]]) -> None:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    writer = IndexedDatasetWriter(prefix, np.dtype(np.uint16))
    for doc in documents:
        writer.add_document(doc)
    writer.close()


def test_the_digest_follows_the_documents_not_the_folder(tmp_path):
    dataset(tmp_path / "a/data/en_text_document", [[1, 2, 3], [4, 5]])
    dataset(tmp_path / "b/data/en_text_document", [[1, 2, 3], [4, 5]])
    same = data_digest([str(tmp_path / "a/data/en_text_document")])
    assert same == data_digest([str(tmp_path / "b/data/en_text_document")])  # same data
    dataset(tmp_path / "b/data/en_text_document", [[1, 2, 3], [4, 5, 6]])  # made again
    assert data_digest([str(tmp_path / "b/data/en_text_document")]) != same


def test_the_page_says_when_the_exported_model_is_older_than_its_data(tmp_path):
    prefix = "data/tokenized/bpe/en_text_document"
    dataset(tmp_path / prefix, [[1, 2, 3], [4, 5]])
    export = tmp_path / "results/export/x/iter_0000008/export.json"
    export.parent.mkdir(parents=True)
    export.write_text(
        json.dumps({"iteration": 8, "data_digest": data_digest([str(tmp_path / prefix)])})
    )
    assert older_than_data(tmp_path, "x", [prefix], 8) is None
    dataset(tmp_path / prefix, [[1, 2, 3], [4, 5], [6]])  # the data made again, the model not
    note = older_than_data(tmp_path, "x", [prefix], 8)
    assert note and "was trained on data made before the data there now" in note, note
    assert "`hpcllm restart-training x`" in note
    export.write_text(json.dumps({"iteration": 8}))  # an export from before digests: not said
    assert older_than_data(tmp_path, "x", [prefix], 8) is None
