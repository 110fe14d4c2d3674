"""Stand-in: megatron.training."""
