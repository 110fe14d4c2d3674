"""Helpers of the vision tests: the val-label forms and the labels expected from a tree."""

from __future__ import annotations

import csv
from pathlib import Path

LABEL_FILES = {
    "folders": {"format": "folders"},
    "loc_solution_csv": {"format": "loc_solution_csv", "file": "LOC_val_solution.csv"},
    "ground_truth": {
        "format": "ground_truth",
        "file": "ILSVRC2012_validation_ground_truth.txt",
        "synsets": "synsets.txt",
    },
}


def expected_labels(
    root: Path, layout: str, split: str, val_form: str = "folders"
) -> dict[str, str]:
    """Relative image path -> wnid, read from the tree by a different route than the packer."""
    if split == "train":
        pattern = "train/*/images/*" if layout == "tinyimagenet" else "train/*/*"
        return {
            str(p.relative_to(root)): p.relative_to(root).parts[1]
            for p in root.glob(pattern)
            if p.is_file()
        }
    if layout == "tinyimagenet":
        lines = (root / "val/val_annotations.txt").read_text().splitlines()
        return {f"val/images/{ln.split()[0]}": ln.split()[1] for ln in lines}
    if val_form == "folders":
        return {str(p.relative_to(root)): p.parent.name for p in root.glob("val/*/*")}
    if val_form == "loc_solution_csv":
        with open(root / "LOC_val_solution.csv") as f:
            return {
                f"val/{r['ImageId']}.JPEG": r["PredictionString"].split()[0]
                for r in csv.DictReader(f)
            }
    synsets = (root / "synsets.txt").read_text().split()
    ids = (root / "ILSVRC2012_validation_ground_truth.txt").read_text().split()
    return {f"val/ILSVRC2012_val_{n:08d}.JPEG": synsets[int(i) - 1] for n, i in enumerate(ids, 1)}
