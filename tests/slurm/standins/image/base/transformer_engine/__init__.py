"""Stand-in: the base image's Transformer Engine (GPU only)."""
