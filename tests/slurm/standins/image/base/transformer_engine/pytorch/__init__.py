"""Stand-in: the base image's Transformer Engine for PyTorch (GPU only)."""
