"""Write small ImageNet-style and TinyImageNet-style trees of real JPEGs (Pillow).

Each image is a colour gradient with shapes and noise, different per class and image, so
the files decode like photographs and compress to realistic sizes (``noise`` sets the
size: about 100 KB at 500x375 with noise 25). Used by the tests, the local
configuration (``make_sample_images``) and ``benchmarks/lmdb_pack.py``.
"""

from __future__ import annotations

import functools
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from hpcllm.atomic import replace as replace_dir
from hpcllm.atomic import temporary_path


def sample_wnids(num_classes: int) -> list[str]:
    """WordNet-id-like class names (sorted order = creation order)."""
    return [f"n{1440764 + 7919 * i:08d}" for i in range(num_classes)]


@functools.lru_cache(maxsize=4)
def _noise_bank(size: tuple[int, int], noise: float) -> np.ndarray:
    """A few noise fields, drawn once: drawing ~500k normals per image would dominate."""
    w, h = size
    return np.random.default_rng(12345).normal(0.0, noise, (8, h, w, 3)).astype(np.float32)


def make_image(seed: int, size: tuple[int, int], noise: float) -> Image.Image:
    rng = np.random.default_rng(seed)
    w, h = size
    c0, c1 = rng.uniform(0, 255, 3).astype(np.float32), rng.uniform(0, 255, 3).astype(np.float32)
    t = np.linspace(0.0, 1.0, w, dtype=np.float32)[None, :, None]
    pixels = np.broadcast_to(c0 * (1 - t) + c1 * t, (h, w, 3))
    if noise:
        field = _noise_bank((w, h), noise)[int(rng.integers(0, 8))]
        pixels = pixels + np.roll(field, (int(rng.integers(0, h)), int(rng.integers(0, w))), (0, 1))
    image = Image.fromarray(pixels.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(4):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(1, w // 2 + 2)), y0 + int(rng.integers(1, h // 2 + 2))
        draw.ellipse((x0, y0, x1, y1), fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    return image


def _save_jpeg(path: Path, seed: int, size: tuple[int, int], noise: float) -> None:
    make_image(seed, size, noise).save(path, "JPEG", quality=90)


def write_sample_tree(
    root: str | os.PathLike,
    layout: str = "imagenet",
    classes: int = 4,
    train_per_class: int = 6,
    val_per_class: int = 2,
    size: tuple[int, int] | None = None,
    noise: float = 8.0,
    val_labels: str = "loc_solution_csv",
    threads: int = 1,
    seed: int = 0,
) -> Path:
    """Write a tree at ``root`` (atomically: under a temporary name, renamed when done).

    ``layout`` imagenet: ``train/<wnid>/<wnid>_<k>.JPEG``, val by ``val_labels``
    (``folders``, ``loc_solution_csv``: flat ``val/`` + ``LOC_val_solution.csv``,
    ``ground_truth``: flat ``val/`` + ``ILSVRC2012_validation_ground_truth.txt`` +
    ``synsets.txt``), plus ``LOC_synset_mapping.txt``. ``tinyimagenet``:
    ``train/<wnid>/images/<wnid>_<k>.JPEG``, ``train/<wnid>/<wnid>_boxes.txt``,
    ``val/images/val_<k>.JPEG`` + ``val/val_annotations.txt``, ``wnids.txt``.
    """
    if layout not in ("imagenet", "tinyimagenet"):
        raise ValueError(f"unknown layout '{layout}'")
    size = tuple(size) if size else ((64, 64) if layout == "tinyimagenet" else (160, 120))
    wnids = sample_wnids(classes)
    jobs: list[tuple[Path, int]] = []
    root = Path(root)
    tmp = temporary_path(root)
    shutil.rmtree(tmp, ignore_errors=True)  # left by a killed run
    try:
        for c, wnid in enumerate(wnids):
            folder = tmp / "train" / wnid / ("images" if layout == "tinyimagenet" else "")
            folder.mkdir(parents=True)
            for k in range(train_per_class):
                jobs.append((folder / f"{wnid}_{k}.JPEG", seed * 1_000_003 + c * 10_007 + k))
            if layout == "tinyimagenet":
                boxes = "".join(f"{wnid}_{k}.JPEG\t0\t0\t63\t63\n" for k in range(train_per_class))
                (tmp / "train" / wnid / f"{wnid}_boxes.txt").write_text(boxes)
        # Val images are numbered across classes in a shuffled order, like the real ones.
        order = np.random.default_rng(seed).permutation(classes * val_per_class)
        val_classes = [int(i) % classes for i in order]
        val_seed = seed * 1_000_003 + 5_000_000
        if layout == "tinyimagenet":
            (tmp / "val" / "images").mkdir(parents=True)
            lines = []
            for n, c in enumerate(val_classes):
                jobs.append((tmp / "val" / "images" / f"val_{n}.JPEG", val_seed + n))
                lines.append(f"val_{n}.JPEG\t{wnids[c]}\t0\t0\t63\t63\n")
            (tmp / "val" / "val_annotations.txt").write_text("".join(lines))
            (tmp / "wnids.txt").write_text("".join(w + "\n" for w in wnids))
        else:
            _imagenet_val(tmp, wnids, val_classes, val_labels, val_seed, jobs)
            (tmp / "LOC_synset_mapping.txt").write_text(
                "".join(f"{w} sample class {i}\n" for i, w in enumerate(wnids))
            )
        with ThreadPoolExecutor(max(1, threads)) as pool:
            for _ in pool.map(lambda job: _save_jpeg(job[0], job[1], size, noise), jobs):
                pass
        replace_dir(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return root


def _imagenet_val(
    tmp: Path,
    wnids: list[str],
    val_classes: list[int],
    val_labels: str,
    val_seed: int,
    jobs: list[tuple[Path, int]],
) -> None:
    (tmp / "val").mkdir()
    names = [f"ILSVRC2012_val_{n + 1:08d}" for n in range(len(val_classes))]
    if val_labels == "folders":
        for wnid in wnids:
            (tmp / "val" / wnid).mkdir()
        for n, (name, c) in enumerate(zip(names, val_classes)):
            jobs.append((tmp / "val" / wnids[c] / f"{name}.JPEG", val_seed + n))
        return
    for n, name in enumerate(names):
        jobs.append((tmp / "val" / f"{name}.JPEG", val_seed + n))
    if val_labels == "loc_solution_csv":
        rows = [f"{name},{wnids[c]} 0 0 10 10 \n" for name, c in zip(names, val_classes)]
        (tmp / "LOC_val_solution.csv").write_text("ImageId,PredictionString\n" + "".join(rows))
    elif val_labels == "ground_truth":
        # Class ids in the devkit's own (non-alphabetical) order: here the reversed wnids.
        id_order = list(reversed(wnids))
        (tmp / "synsets.txt").write_text("".join(w + "\n" for w in id_order))
        lines = [f"{id_order.index(wnids[c]) + 1}\n" for c in val_classes]
        (tmp / "ILSVRC2012_validation_ground_truth.txt").write_text("".join(lines))
    else:
        raise ValueError(f"unknown val_labels '{val_labels}'")
