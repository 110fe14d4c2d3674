# hpcllm: raw data to trained checkpoints and benchmark reports on HPC clusters.
# The rules say what depends on what; the package under src/hpcllm does the work.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/text.smk"
include: "workflow/rules/vision.smk"
include: "workflow/rules/containers.smk"
include: "workflow/rules/training.smk"
include: "workflow/rules/benchmarks.smk"


rule all:
    default_target: True
    input:
        all_targets,
