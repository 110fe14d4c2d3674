#!/usr/bin/env bash
# Snakemake runs this in the environment of envs/workflow.yaml once it has made it
# (`--software-deployment-method conda`). The GPU jobs' Megatron Core: its wheel says
# Requires-Python >= 3.12 and this environment's Python is 3.11, so pip installs it only
# past that, as the Makefile does (src/hpcllm/models/megatron_compat.py says why).
set -euo pipefail
python -m pip install --no-deps --ignore-requires-python megatron-core==0.19.0
