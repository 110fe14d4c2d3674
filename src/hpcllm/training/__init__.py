"""Staged training: the pre-flight planner, the two engines and their checkpoints.

- ``planner``: parallel layout and memory checks, run at plan time (dry run included).
- ``presets``: model and optimizer presets (OpenGPT-X 800M, GPT-3 175B, ...).
- ``megatron_args``: Megatron-LM's ``pretrain_gpt.py`` command, flags per pinned version.
- ``torch_engine``: a small Hugging Face causal LM trained with PyTorch (CPU, one GPU, DDP).
- ``data``: Megatron Core's ``GPTDataset`` built on the CPU from ``.bin/.idx`` files.
- ``checkpoints``: Megatron's checkpoint directory layout, the tracker file as commit marker.
- ``segment``: one segment of a chained training run, as the ``train_segment`` rule runs it.
"""
