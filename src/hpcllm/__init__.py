"""hpcllm: the logic behind the workflow, importable and tested without Snakemake."""

__version__ = "0.1.0"
