"""Staged training of a language model in segments, in four rooms (each imports only
from the rooms before it, and from ``hpcllm.models`` for presets, layout and Megatron-LM's
flags, which the benchmarks share):

- ``checkpoints``: Megatron's checkpoint folder (``tracker``: the tracker file as commit
  marker), its ``checksums``, ``retention`` and the writer's ``lease``.
- ``plan``: what a campaign is planned with: the checked experiment (``experiment``),
  its data (``data``, ``data_checks``, ``passes``), its jobs (``job_plan``) and the
  settings its checkpoints were trained with (``settings``).
- ``engines``: the two engines (``torch_engine``; Megatron-LM, whose model
  ``megatron_model`` builds without it), their command lines (``command``), their log
  lines (``log_lines``) and the dataset index cache they load (``cache``).
- ``campaign``: running it: a ``segment`` and its engine's process (``engine_process``),
  its ``attempts``, the Slurm ``chain`` (``chain_site``: whether there is one),
  ``status``, ``restart`` and the loss ``curves``.
"""
