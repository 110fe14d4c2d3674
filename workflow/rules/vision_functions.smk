# The vision stage's globals, plan-time checks and input/params functions (its rules:
# vision.smk, which includes this file first).
from pathlib import Path

from hpcllm.vision.datasets_config import check_dataset, dataset_root, is_configured

VISION = config["vision"]
IMAGE_DATASETS = VISION["datasets"]
PACK_JOB = package_module("hpcllm.vision.pack_job")

# A missing tree or labels file is reported here, at plan time (dry run included).
for _name, _dataset in IMAGE_DATASETS.items():
    if is_configured(_dataset):
        check_dataset(_name, _dataset)


def vision_targets():
    return [
        f"data/vision/{name}/{split}.lmdb"
        for name, cfg in IMAGE_DATASETS.items()
        if is_configured(cfg)
        for split in cfg["splits"]
    ]


def image_dataset_config(wildcards):
    return IMAGE_DATASETS[wildcards.dataset]


def image_tree(wildcards):
    """The split's folder: made by make_sample_images for a sample, else the user's tree."""
    cfg = IMAGE_DATASETS[wildcards.dataset]
    root = dataset_root(wildcards.dataset, cfg)
    return root if "sample" in cfg else f"{root}/{wildcards.split}"
