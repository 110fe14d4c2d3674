# The vision stage's globals, plan-time checks and input/params functions (its rules:
# vision.smk, which includes this file first).
from pathlib import Path

from snakemake.settings.types import DeploymentMethod

from hpcllm.vision.datasets_config import check_dataset, dataset_root, is_configured

VISION = config["vision"]
IMAGE_DATASETS = VISION["datasets"]
# pack_lmdb's checkout and Python, as Paths: Snakemake records no Path among a job's params
# (only plain values), so another venv or a moved checkout does not make packed splits out
# of date. The Python is the one script: would use: the conda environment's where
# Snakemake deploys it (--software-deployment-method conda), else the Python running
# Snakemake (the project's venv, which need not be activated).
VISION_JOB_SRC = Path(HPCLLM_ROOT, "src")
VISION_JOB_PYTHON = Path(
    "python"
    if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
    else sys.executable
)

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
