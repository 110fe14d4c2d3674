"""Pre-flight on the real site: a probe per site and image, a canary per GPU job type.

Before the first GPU job that depends on them the workflow runs, as Slurm jobs:

- the **site probe** (:mod:`hpcllm.preflight.probe`): one small job per image that checks
  what the plan assumes of the site and records the answers (date, job id, host, each
  check as ``{check, ok, detail}``) as JSON under ``results/preflight/<cluster>/probe/``;
- a **canary** per GPU job type (:mod:`hpcllm.preflight.canary`): the real command line,
  image and launch script at minimal size (one node, a scaled-down model, a few
  iterations), for training through a checkpoint save and a resume from it.

The GPU jobs take the canary's record as an input, so a failed canary holds them back.
Both are keyed by what they checked (:func:`hpcllm.preflight.probe.probe_key`,
:func:`hpcllm.preflight.canary.canary_key`): Snakemake reruns them exactly when that
changes (docs/clusters.md, "Pre-flight").
"""
