"""Stand-in: the base image's TensorBoard (not in the rehearsal image's environment)."""

__version__ = "2.20.0"
