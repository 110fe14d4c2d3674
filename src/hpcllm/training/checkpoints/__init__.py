"""Megatron's checkpoint folder: the tracker (``tracker``), checksums, retention, and the
lease of the one job that writes it."""
