"""Stand-in: Transformer Engine's fused Adam, which the distributed optimizer resumes with."""
