"""List the images and labels of one split of an ImageNet-1k or TinyImageNet-200 tree.

Layouts (``root`` is the dataset's top folder):

- ``imagenet``: ``train/<wnid>/*.JPEG``; ``val/`` either in class folders like train, or
  flat (``val/*.JPEG``) with a labels file: ``LOC_val_solution.csv`` (Kaggle's
  ``ImageId,PredictionString``; the first word of the prediction string is the wnid), or
  the devkit's ground-truth list (one ILSVRC2012 class id per line, line n is
  ``ILSVRC2012_val_<n:08d>``) plus a synset list whose line i is the wnid of class id i.
- ``tinyimagenet``: ``train/<wnid>/images/*.JPEG``; ``val/images/*.JPEG`` plus
  ``val/val_annotations.txt`` (``file<TAB>wnid<TAB>box...``).

The class index of a wnid is its position in the sorted list of the train folders, as
torchvision's ImageFolder numbers them, so train and val agree. Listing never reads image
contents; problems it can see (an empty class folder, an image without a label, a label
without an image, an image labelled twice) are returned with their path, and the caller
decides between failing and skipping.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LAYOUTS = ("imagenet", "tinyimagenet")
SPLITS = ("train", "val")
VAL_LABEL_FORMATS = ("folders", "loc_solution_csv", "ground_truth")
_DEVKIT_VAL_NAME = re.compile(r"^ILSVRC2012_val_(\d{8})$")


@dataclass(frozen=True)
class Sample:
    path: Path  # the image file
    key: str  # path relative to the dataset root, stored in the record and in reports
    label: int


@dataclass(frozen=True)
class Problem:
    path: str  # the file (and line) the problem is in
    kind: str  # empty_class, no_label, no_image, duplicate, unreadable, not_an_image, ...
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass
class SplitListing:
    classes: list[str]
    samples: list[Sample]
    problems: list[Problem] = field(default_factory=list)
    # Images that a problem makes unusable (their label is unknown or ambiguous).
    excluded: set[str] = field(default_factory=set)


class BadInputError(ValueError):
    """Bad input data; the message names every file concerned (up to a limit)."""


def _files(folder: Path) -> list[Path]:
    """Regular files of ``folder`` in sorted order (hidden files included: they are input)."""
    with os.scandir(folder) as entries:
        names = sorted(e.name for e in entries if e.is_file(follow_symlinks=True))
    return [folder / name for name in names]  # sorting names: Path comparisons cost 2x


def _subdirs(folder: Path) -> list[str]:
    with os.scandir(folder) as entries:
        return sorted(e.name for e in entries if e.is_dir(follow_symlinks=True))


def _require_dir(path: Path, what: str) -> None:
    if not path.is_dir():
        raise BadInputError(f"{path}: {what} not found (is the dataset's root right?)")


def list_classes(root: Path) -> list[str]:
    """The wnids of the train folders, sorted: position = class index."""
    train = root / "train"
    _require_dir(train, "the train folder, whose class folders define the class list,")
    classes = _subdirs(train)
    if not classes:
        raise BadInputError(f"{train}: no class folders")
    return classes


def _class_folders(
    root: Path, split_dir: Path, classes: list[str], images_sub: str | None
) -> SplitListing:
    index = {wnid: i for i, wnid in enumerate(classes)}
    listing = SplitListing(classes, [])
    for wnid in _subdirs(split_dir):
        folder = split_dir / wnid / images_sub if images_sub else split_dir / wnid
        if wnid not in index:
            listing.problems.append(
                Problem(
                    str(split_dir / wnid),
                    "unknown_class",
                    f"class folder '{wnid}' is not among the {len(classes)} train classes",
                )
            )
            if folder.is_dir():
                listing.excluded.update(str(p.relative_to(root)) for p in _files(folder))
            continue
        files = _files(folder) if folder.is_dir() else []
        if not files:
            listing.problems.append(
                Problem(str(folder), "empty_class", f"class folder of '{wnid}' holds no images")
            )
        rel = str(folder.relative_to(root))  # once per folder: relative_to per file is slow
        for path in files:
            listing.samples.append(Sample(path, f"{rel}/{path.name}", index[wnid]))
    return listing


def _labelled_flat(
    root: Path,
    image_dir: Path,
    classes: list[str],
    labels: Iterable[tuple[str, str, str]],
    match_stem: bool,
) -> SplitListing:
    """Images of a flat folder joined with (name, wnid, where) label entries."""
    index = {wnid: i for i, wnid in enumerate(classes)}
    listing = SplitListing(classes, [])
    images: dict[str, Path] = {}
    for path in _files(image_dir):
        name = path.stem if match_stem else path.name
        if name in images:
            listing.problems.append(
                Problem(
                    str(path), "duplicate", f"'{name}' also names {images[name].name}; rename one"
                )
            )
            listing.excluded.update(str(p.relative_to(root)) for p in (path, images[name]))
        images[name] = path
    label_of: dict[str, tuple[str, str]] = {}
    for name, wnid, where in labels:
        if name in label_of:
            listing.problems.append(
                Problem(
                    where, "duplicate", f"'{name}' is labelled again (first at {label_of[name][1]})"
                )
            )
            if name in images:
                listing.excluded.add(str(images[name].relative_to(root)))
            continue
        label_of[name] = (wnid, where)
        if wnid not in index:
            listing.problems.append(
                Problem(where, "unknown_class", f"label '{wnid}' is not among the train classes")
            )
            if name in images:
                listing.excluded.add(str(images[name].relative_to(root)))
        if name not in images:
            listing.problems.append(
                Problem(where, "no_image", f"label for '{name}' but no such image in {image_dir}")
            )
    for name, path in images.items():
        if name not in label_of:
            listing.problems.append(Problem(str(path), "no_label", "image without a label"))
            listing.excluded.add(str(path.relative_to(root)))
            continue
        wnid = label_of[name][0]
        if wnid in index:
            listing.samples.append(Sample(path, str(path.relative_to(root)), index[wnid]))
    listing.samples.sort(key=lambda s: s.key)
    return listing


def _loc_solution_csv(path: Path) -> Iterable[tuple[str, str, str]]:
    with open(path, newline="") as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header is None or [h.strip() for h in header[:2]] != ["ImageId", "PredictionString"]:
            raise BadInputError(
                f"{path}:1: expected the header 'ImageId,PredictionString' of LOC_val_solution.csv"
            )
        for lineno, row in enumerate(rows, start=2):
            words = row[1].split() if len(row) >= 2 else []
            if not row or not words:
                raise BadInputError(f"{path}:{lineno}: expected 'ImageId,<wnid> <box>...'")
            yield row[0].strip(), words[0], f"{path}:{lineno}"


def _ground_truth(path: Path, synsets: Path) -> Iterable[tuple[str, str, str]]:
    wnids = [line.split()[0] for line in synsets.read_text().splitlines() if line.strip()]
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            class_id = int(line)
            if class_id < 1:
                raise IndexError
            wnid = wnids[class_id - 1]
        except (ValueError, IndexError):
            raise BadInputError(
                f"{path}:{lineno}: expected a class id from 1 to {len(wnids)} (the lines of "
                f"{synsets}), got '{line.strip()}'"
            ) from None
        yield f"ILSVRC2012_val_{lineno:08d}", wnid, f"{path}:{lineno}"


def _tiny_annotations(path: Path) -> Iterable[tuple[str, str, str]]:
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2:
            raise BadInputError(f"{path}:{lineno}: expected 'file<TAB>wnid<TAB>...'")
        yield fields[0].strip(), fields[1].strip(), f"{path}:{lineno}"


def _resolve(root: Path, name: str | None, key: str) -> Path:
    if not name:
        raise BadInputError(f"vision: the key '{key}' is needed for this val layout")
    path = root / name
    if not path.is_file():
        raise BadInputError(f"{path}: not found (config key '{key}', relative to the root)")
    return path


def list_split(
    root: str | os.PathLike, layout: str, split: str, val_labels: dict[str, Any] | None = None
) -> SplitListing:
    """List one split of the tree at ``root`` (see the module doc for the layouts)."""
    root = Path(root)
    if layout not in LAYOUTS:
        raise BadInputError(f"unknown layout '{layout}'; expected one of {', '.join(LAYOUTS)}")
    if split not in SPLITS:
        raise BadInputError(f"unknown split '{split}'; expected one of {', '.join(SPLITS)}")
    classes = list_classes(root)
    split_dir = root / split
    _require_dir(split_dir, f"the {split} folder")
    if layout == "tinyimagenet":
        if split == "train":
            return _class_folders(root, split_dir, classes, "images")
        _require_dir(split_dir / "images", "TinyImageNet's val/images folder")
        annotations = _resolve(root, f"{split}/val_annotations.txt", "val/val_annotations.txt")
        return _labelled_flat(
            root, split_dir / "images", classes, _tiny_annotations(annotations), False
        )
    if split == "train":
        return _class_folders(root, split_dir, classes, None)
    labels = dict(val_labels or {})
    fmt = labels.get("format", "folders")
    if fmt == "folders":
        if not _subdirs(split_dir) and _files(split_dir):
            raise BadInputError(
                f"{split_dir}: the val images lie flat, not in class folders; set "
                "val_labels.format to loc_solution_csv or ground_truth and name its file"
            )
        return _class_folders(root, split_dir, classes, None)
    if fmt == "loc_solution_csv":
        entries = _loc_solution_csv(_resolve(root, labels.get("file"), "val_labels.file"))
        return _labelled_flat(root, split_dir, classes, entries, True)
    if fmt == "ground_truth":
        entries = _ground_truth(
            _resolve(root, labels.get("file"), "val_labels.file"),
            _resolve(root, labels.get("synsets"), "val_labels.synsets"),
        )
        return _labelled_flat(root, split_dir, classes, entries, True)
    raise BadInputError(
        f"unknown val_labels.format '{fmt}'; expected one of {', '.join(VAL_LABEL_FORMATS)}"
    )


def check_tree(
    root: str | os.PathLike,
    layout: str,
    splits: Iterable[str],
    val_labels: dict[str, Any] | None = None,
) -> None:
    """Cheap plan-time check (no listing of the images): the folders and label files exist."""
    root = Path(root)
    _require_dir(root, "the dataset root")
    list_classes(root)
    for split in splits:
        _require_dir(root / split, f"the {split} folder")
    if "val" in splits:
        if layout == "tinyimagenet":
            _resolve(root, "val/val_annotations.txt", "val/val_annotations.txt")
        elif (val_labels or {}).get("format", "folders") != "folders":
            _resolve(root, val_labels.get("file"), "val_labels.file")
            if val_labels.get("format") == "ground_truth":
                _resolve(root, val_labels.get("synsets"), "val_labels.synsets")
