# hpcllm: raw data to trained checkpoints and benchmark reports on HPC clusters.
# The rules say what depends on what; the package under src/hpcllm does the work.
from snakemake.utils import min_version

min_version("9.0")

# Command-line traps of the config options (a target read as a config file, a second
# --configfile), the built-in config's YAML syntax and keys given twice in a config file,
# named before the config is read and checked (hpcllm/commandline.py).
import os
import sys

# This checkout: the Snakefile's folder, also where the workflow is a `module` of another
# project's Snakefile (workflow.basedir is then that project's folder).
HPCLLM_ROOT = workflow.current_basedir.get_path_or_uri(secret_free=False)
sys.path.insert(0, os.path.join(HPCLLM_ROOT, "src"))
from snakemake.exceptions import WorkflowError
from hpcllm import commandline

if workflow.is_main_process:
    for _warning in commandline.target_like_configfiles(
        workflow.overwrite_configfiles, os.getcwd()
    ) + [commandline.repeated_configfile(sys.argv)]:
        if _warning:
            logger.warning(f"Warning: {_warning}")
_problem = commandline.yaml_syntax_error("config/config.yaml")
if _problem:
    raise WorkflowError(_problem)
# A key given twice in one config file: Snakemake's YAML loader keeps the last one silently.
# Jobs re-read the files the controller has checked.
if workflow.is_main_process:
    _problems = [
        p
        for _path in ["config/config.yaml", *workflow.overwrite_configfiles]
        for p in commandline.duplicate_keys(_path)
    ]
    if _problems:
        raise WorkflowError("\n".join(_problems))


configfile: "config/config.yaml"


# The landing page of `snakemake --report`: it points at the results page first, and
# where the report has none (a config that plans none), says how to make one.
report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/text.smk"
include: "workflow/rules/vision.smk"
include: "workflow/rules/containers.smk"
include: "workflow/rules/preflight.smk"
include: "workflow/rules/training.smk"
include: "workflow/rules/export.smk"
include: "workflow/rules/benchmarks.smk"
include: "workflow/rules/results.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/cost.smk"


# A target that names an experiment the config does not define (Snakemake would say only
# "No rule to produce ..."): the experiments it defines, and the closest.
if workflow.is_main_process:
    _problem = commandline.unknown_experiment_targets(
        commandline.requested_targets(sys.argv),
        EXPERIMENTS,
        [r.name for r in workflow.rules],
    )
    if _problem:
        raise WorkflowError(_problem)


rule all:
    default_target: True
    input:
        all_targets,


# After a failed run: each failed job's reason line, its log, and the rerun that fixes a
# damaged workflow file (Snakemake itself prints only "message: None ... check log").
onerror:
    from hpcllm.failures.summary import failure_summary

    for _line in failure_summary(log):
        logger.error(_line)
