"""Packing both layouts and every val-label form, byte for byte; every kind of bad input."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from vision_helpers import LABEL_FILES, expected_labels

from hpcllm.vision import lmdb_pack
from hpcllm.vision.lmdb_dataset import LMDBImageDataset, read_meta
from hpcllm.vision.lmdb_pack import image_problem, pack_lmdb
from hpcllm.vision.sample_data import write_sample_tree
from hpcllm.vision.trees import BadInputError, list_split


def pack(root: Path, out: Path, layout: str, split: str, val_form: str = "folders", **kw):
    listing = list_split(root, layout, split, LABEL_FILES[val_form])
    return pack_lmdb(listing, out / f"{split}.lmdb", out / f"{split}.report.json", **kw)


def assert_matches_tree(lmdb: Path, root: Path, expected: dict[str, str]) -> None:
    """Every image of ``expected`` is in the LMDB once, with its bytes and its label."""
    ds = LMDBImageDataset(lmdb)
    assert ds.classes == sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
    assert len(ds) == ds.num_samples == len(expected)
    seen = {}
    for i in range(len(ds)):
        data, label, name = ds.read_record(i)
        assert data == (root / name).read_bytes(), name
        assert ds.classes[label] == expected[name], name
        seen[name] = label
        image, image_label = ds[i]
        assert image.mode == "RGB" and image.size[0] > 0 and image_label == label
    assert set(seen) == set(expected)
    assert list(seen) == sorted(seen)  # records in sorted path order


@pytest.mark.parametrize("val_form", ["folders", "loc_solution_csv", "ground_truth"])
def test_imagenet_both_splits_byte_for_byte(tmp_path, val_form):
    root = write_sample_tree(
        tmp_path / "tree",
        "imagenet",
        classes=3,
        train_per_class=3,
        val_per_class=2,
        val_labels=val_form,
    )
    for split in ("train", "val"):
        report = pack(root, tmp_path / "out", "imagenet", split, val_form)
        expected = expected_labels(root, "imagenet", split, val_form)
        assert report["num_samples"] == len(expected) and report["num_skipped"] == 0
        assert_matches_tree(tmp_path / "out" / f"{split}.lmdb", root, expected)
    assert not list((tmp_path / "out").glob("*.incomplete"))


def test_tinyimagenet_both_splits_byte_for_byte(tiny_tree, tmp_path):
    for split in ("train", "val"):
        pack(tiny_tree, tmp_path, "tinyimagenet", split)
        assert_matches_tree(
            tmp_path / f"{split}.lmdb", tiny_tree, expected_labels(tiny_tree, "tinyimagenet", split)
        )
    meta = read_meta(tmp_path / "val.lmdb")
    assert meta["num_samples"] == 6 and len(meta["classes"]) == 3
    # The per-class box files next to images/ are not images of the split.
    assert all(
        "images/" in LMDBImageDataset(tmp_path / "train.lmdb").read_record(i)[2] for i in range(12)
    )


def test_map_grows_in_small_transactions(imagenet_tree, tmp_path, monkeypatch, caplog):
    import hpcllm.progress

    monkeypatch.setattr(hpcllm.progress, "INTERVAL_S", 0.0)  # a progress line per image
    caplog.set_level("INFO", logger="hpcllm.progress")
    report = pack(
        imagenet_tree,
        tmp_path,
        "imagenet",
        "train",
        map_size=64 << 10,
        txn_bytes=8 << 10,
        threads=2,
    )
    assert report["map_grown"] >= 1
    lines = [r.getMessage() for r in caplog.records if r.name == "hpcllm.progress"]
    n = report["num_samples"]
    # the first line has no rate yet (it is measured from the first image on); later ones do
    assert lines[0].startswith(f"pack train.lmdb: 1 of {n} images") and "ETA" not in lines[0]
    assert any("ETA" in line for line in lines[1:-1]), lines
    assert lines[-1].startswith(f"pack train.lmdb: {n} of {n} images (100.0%)"), lines
    assert_matches_tree(
        tmp_path / "train.lmdb", imagenet_tree, expected_labels(imagenet_tree, "imagenet", "train")
    )


@pytest.mark.skipif(sys.platform != "linux", reason="sync_file_range is Linux's")
def test_each_commit_starts_the_disk_writes(imagenet_tree, tmp_path, monkeypatch):
    """The pack does not leave the whole LMDB to the final fsync: after every commit the
    kernel is asked to start writing the file (sync_file_range returns 0: started)."""
    started, start = [], lmdb_pack._Writeback.start

    def spy(self):
        started.append((Path(f"/proc/self/fd/{self.fd}").resolve().name, start(self)))
        return started[-1][1]

    monkeypatch.setattr(lmdb_pack._Writeback, "start", spy)
    pack(imagenet_tree, tmp_path, "imagenet", "train", txn_bytes=1)
    images = len(expected_labels(imagenet_tree, "imagenet", "train"))
    assert len(started) >= images  # a commit per image here
    assert set(started) == {("data.mdb", 0)}


def test_image_problem_checks():
    jpeg = (Path(__file__).parent / "conftest.py").read_bytes()
    assert "not an image" in image_problem(jpeg)
    assert image_problem(b"") == "empty file"


def test_a_complete_jpeg_with_zero_padding_passes_the_header_check(imagenet_tree):
    """The end-of-image marker ends the file, give or take zero padding (some writers
    pad); without the marker the JPEG is truncated."""
    data = next((imagenet_tree / "train").glob("*/*.JPEG")).read_bytes()
    assert image_problem(data) is None
    assert image_problem(data + bytes(100)) is None
    assert image_problem(data[:-2]) == "truncated JPEG (no end-of-image marker)"


# Each bad-input case: (how to break a fresh tree, split, path the message must name, val form)
def corrupt_jpeg(root: Path) -> Path:
    path = next((root / "train").glob("*/*_1.JPEG"))
    data = bytearray(path.read_bytes())
    data[2:400] = bytes(398)  # the header segments are zeros now
    path.write_bytes(bytes(data))
    return path


def truncated_jpeg(root: Path) -> Path:
    path = next((root / "train").glob("*/*_2.JPEG"))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def non_image(root: Path) -> Path:
    path = next((root / "train").iterdir()) / "README.txt"
    path.write_text("not a picture\n")
    return path


def empty_class(root: Path) -> Path:
    path = root / "train" / "n99999999"
    path.mkdir()
    return path


def val_without_label(root: Path) -> Path:
    path = root / "val" / "ILSVRC2012_val_00000099.JPEG"
    shutil.copy(root / "val" / "ILSVRC2012_val_00000001.JPEG", path)
    return path


def label_without_image(root: Path) -> Path:
    (root / "val" / "ILSVRC2012_val_00000002.JPEG").unlink()
    return root / "LOC_val_solution.csv"


def duplicate_label(root: Path) -> Path:
    csv = root / "LOC_val_solution.csv"
    lines = csv.read_text().splitlines(keepends=True)
    csv.write_text("".join(lines) + lines[3])
    return csv


def duplicate_image_name(root: Path) -> Path:
    path = root / "val" / "ILSVRC2012_val_00000003.jpg"  # same ImageId as ..._00000003.JPEG
    shutil.copy(root / "val" / "ILSVRC2012_val_00000003.JPEG", path)
    return path


BAD_CASES = {
    "corrupt_jpeg": (corrupt_jpeg, "train", -1),
    "truncated_jpeg": (truncated_jpeg, "train", -1),
    "non_image": (non_image, "train", 0),
    "empty_class": (empty_class, "train", 0),
    "val_without_label": (val_without_label, "val", 0),
    "label_without_image": (label_without_image, "val", -1),
    "duplicate_label": (duplicate_label, "val", -1),
    "duplicate_image_name": (duplicate_image_name, "val", -1),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_input_fails_naming_the_path_and_leaves_nothing(imagenet_tree, tmp_path, case):
    breaker, split, _ = BAD_CASES[case]
    root = shutil.copytree(imagenet_tree, tmp_path / "tree")
    bad = breaker(root)
    out = tmp_path / "out"
    with pytest.raises(BadInputError) as err:
        pack(root, out, "imagenet", split, "loc_solution_csv")
    assert str(bad) in str(err.value)
    assert not out.exists() or not list(out.iterdir())  # no LMDB, no report, no .incomplete


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_input_skipped_and_reported(imagenet_tree, tmp_path, case):
    breaker, split, change = BAD_CASES[case]
    root = shutil.copytree(imagenet_tree, tmp_path / "tree")
    expected = expected_labels(root, "imagenet", split, "loc_solution_csv")
    bad = breaker(root)
    report = pack(root, tmp_path, "imagenet", split, "loc_solution_csv", on_bad_image="skip")
    on_disk = json.loads((tmp_path / f"{split}.report.json").read_text())
    assert on_disk == report
    assert any(str(bad) in s["path"] for s in report["skipped"]), report["skipped"]
    ds = LMDBImageDataset(tmp_path / f"{split}.lmdb")
    assert ds.num_samples == len(expected) + change
    for i in range(ds.num_samples):  # what was packed is intact and correctly labelled
        data, label, name = ds.read_record(i)
        assert data == (root / name).read_bytes() and ds.classes[label] == expected[name]


def test_a_split_whose_images_are_all_skipped_is_an_error_not_an_empty_lmdb(
    imagenet_tree, tmp_path
):
    root = shutil.copytree(imagenet_tree, tmp_path / "tree")
    for path in (root / "train").glob("*/*.JPEG"):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(BadInputError, match="no usable images among the 12 listed"):
        pack(root, tmp_path / "out", "imagenet", "train", on_bad_image="skip")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_failed_repack_keeps_the_previous_lmdb(imagenet_tree, tmp_path):
    root = shutil.copytree(imagenet_tree, tmp_path / "tree")
    pack(root, tmp_path / "out", "imagenet", "train")
    before = (tmp_path / "out" / "train.lmdb" / "data.mdb").read_bytes()
    truncated_jpeg(root)
    with pytest.raises(BadInputError):
        pack(root, tmp_path / "out", "imagenet", "train")
    assert (tmp_path / "out" / "train.lmdb" / "data.mdb").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "train.lmdb",
        "train.report.json",
    ]


def test_a_repacked_lmdb_is_read_anew_in_the_same_process(imagenet_tree, tmp_path):
    pack(imagenet_tree, tmp_path, "imagenet", "train")
    assert LMDBImageDataset(tmp_path / "train.lmdb").num_samples == 12
    root = shutil.copytree(imagenet_tree, tmp_path / "tree")
    (next((root / "train").glob("*/*_0.JPEG"))).unlink()
    pack(root, tmp_path, "imagenet", "train")
    assert LMDBImageDataset(tmp_path / "train.lmdb").num_samples == 11


def test_missing_labels_file_and_flat_val_are_explained(imagenet_tree):
    with pytest.raises(BadInputError, match="val_labels.format"):
        list_split(imagenet_tree, "imagenet", "val", {"format": "folders"})
    with pytest.raises(BadInputError, match="nope.csv: not found"):
        list_split(
            imagenet_tree, "imagenet", "val", {"format": "loc_solution_csv", "file": "nope.csv"}
        )


def test_a_full_disk_is_named_with_its_file_system_and_the_space_needed(imagenet_tree, tmp_path):
    """A 64 KiB file system (real tmpfs) for the train split: LMDB's own error is an I/O
    error of its commit ("mdb_txn_commit: Input/output error"); the pack names the LMDB,
    the file system, its free space, what the whole LMDB needs and the fix, and leaves
    nothing behind."""
    from support import small_file_system

    from hpcllm.diskspace import DiskFull

    with small_file_system(tmp_path / "fs", "64k") as fs:
        with pytest.raises(DiskFull) as raised:
            pack(imagenet_tree, fs, "imagenet", "train", txn_bytes=16 << 10)
        left = sorted(p.name for p in fs.iterdir())
    message = str(raised.value)
    assert message.startswith(f"no space left on device writing {fs / 'train.lmdb'}: "), message
    assert f"the file system at {fs} has " in message and "free of 64.0 KiB" in message
    assert "this step needs " in message and f"Fix: free space on {fs}" in message
    assert "(LMDB: mdb_txn_commit: Input/output error)" in message
    assert left == ["mount-point"]  # no partial LMDB, no report
