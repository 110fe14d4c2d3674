"""Stand-in: megatron.core.datasets."""
