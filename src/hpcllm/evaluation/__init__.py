"""Evaluation of an exported checkpoint (docs/evaluation.md).

lm-evaluation-harness on the Hugging Face export (``harness``), its task data read offline
from local folders (``tasks``), held-out perplexity on the experiment's own validation
split (``perplexity``), and the per-experiment table both go into (``table``).
"""
