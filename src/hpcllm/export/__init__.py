"""Export of training checkpoints as Hugging Face model folders (docs/export.md)."""
