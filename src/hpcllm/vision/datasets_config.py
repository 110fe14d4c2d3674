"""The ``vision`` config section: where each dataset's tree is, and the two workflow steps
(``make_sample_images``, ``pack_lmdb``) as plain functions of paths and config dicts."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from hpcllm.vision.lmdb_pack import pack_lmdb
from hpcllm.vision.trees import check_tree, list_split

SAMPLE_ROOT = "data/vision/sample"
_SAMPLE_LABEL_FILES = {
    "folders": {},
    "loc_solution_csv": {"file": "LOC_val_solution.csv"},
    "ground_truth": {"file": "ILSVRC2012_validation_ground_truth.txt", "synsets": "synsets.txt"},
}


def dataset_root(name: str, cfg: dict[str, Any]) -> str:
    """The tree's folder: the generated sample's, or ``root``."""
    if "sample" in cfg and "root" in cfg:
        raise ValueError(f"vision.datasets.{name}: give either root or sample, not both")
    if "sample" in cfg:
        return f"{SAMPLE_ROOT}/{name}"
    if "root" not in cfg:
        raise ValueError(
            f"vision.datasets.{name}: give root (the folder with train/ and val/) or sample"
        )
    missing = unset_variables(cfg["root"])
    if missing:
        raise ValueError(
            f"vision.datasets.{name}.root is {cfg['root']}, but ${missing[0]} is not set: "
            f"export {missing[0]}=<the folder holding train/ and val/> (or set root)"
        )
    return os.path.expandvars(os.path.expanduser(cfg["root"]))


def unset_variables(text: str) -> list[str]:
    """The ``$NAME``/``${NAME}`` references in ``text`` that the environment lacks."""
    names = re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", text)
    return [n for n in names if n not in os.environ]


def is_configured(cfg: dict[str, Any]) -> bool:
    """A generated sample, or a root whose variables are all set. Datasets such as the
    built-in ``imagenet`` (root ``$HPCLLM_IMAGENET_ROOT``) are packed once the user
    sets the variable, or fail with a clear message when a benchmark needs them."""
    return "sample" in cfg or ("root" in cfg and not unset_variables(cfg["root"]))


def val_labels(cfg: dict[str, Any]) -> dict[str, Any]:
    if "sample" in cfg:
        fmt = cfg["sample"].get("val_labels", "loc_solution_csv")
        return {"format": fmt, **_SAMPLE_LABEL_FILES[fmt]}
    return dict(cfg.get("val_labels") or {})


def check_dataset(name: str, cfg: dict[str, Any]) -> None:
    """At plan time: a given root has its folders and label files (a sample is made later)."""
    root = dataset_root(name, cfg)
    if "sample" in cfg:
        return
    try:
        check_tree(root, cfg["layout"], cfg.get("splits", ["train", "val"]), val_labels(cfg))
    except ValueError as e:
        raise ValueError(f"vision.datasets.{name} (root {root}): {e}") from None


def make_sample(name: str, cfg: dict[str, Any], out_dir: str | os.PathLike, threads: int) -> Path:
    # here, not at the top: the generator's numpy is no cost of every pack_lmdb job
    from hpcllm.vision.sample_data import write_sample_tree

    sample = cfg["sample"]
    size = None
    if "width" in sample or "height" in sample:
        default = 64 if cfg["layout"] == "tinyimagenet" else None
        size = (sample.get("width", default or 160), sample.get("height", default or 120))
    return write_sample_tree(
        out_dir,
        cfg["layout"],
        classes=sample.get("classes", 4),
        train_per_class=sample.get("train_per_class", 6),
        val_per_class=sample.get("val_per_class", 2),
        size=size,
        val_labels=sample.get("val_labels", "loc_solution_csv"),
        threads=threads,
        seed=sum(name.encode()),  # differs between datasets, stable between runs
    )


def pack_dataset_split(
    name: str,
    cfg: dict[str, Any],
    vision: dict[str, Any],
    split: str,
    out_lmdb: str | os.PathLike,
    out_report: str | os.PathLike,
    threads: int = 4,
) -> dict[str, Any]:
    """``pack_lmdb`` for one dataset and split, with the section's policies."""
    root = dataset_root(name, cfg)
    listing = list_split(root, cfg["layout"], split, val_labels(cfg))
    return pack_lmdb(
        listing,
        out_lmdb,
        out_report,
        meta={"dataset": name, "split": split, "layout": cfg["layout"], "root": str(root)},
        on_bad_image=cfg.get("on_bad_image", vision.get("on_bad_image", "fail")),
        check=vision.get("check", "header"),
        threads=threads,
    )
