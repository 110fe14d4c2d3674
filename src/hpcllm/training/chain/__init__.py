"""``python -m hpcllm.training.chain``: the chain's command line before training's rooms.

Kept for chain jobs already queued in Slurm, whose command names this path (``__main__``
runs :func:`hpcllm.training.campaign.chain.main`); the chain is
:mod:`hpcllm.training.campaign.chain`.
"""
