"""Language models as training and the benchmarks both run them.

- ``presets``: model and optimizer presets (OpenGPT-X 800M, GPT-3 175B, ...).
- ``planner``: parallel layout and memory per GPU, checked at plan time.
- ``megatron_args``: Megatron-LM's ``pretrain_gpt.py`` command, flags per pinned version.
"""
