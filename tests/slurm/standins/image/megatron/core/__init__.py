"""Stand-in: megatron.core (its GPU code cannot run here)."""
