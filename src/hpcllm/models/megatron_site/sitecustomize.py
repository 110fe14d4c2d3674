"""Imported by ``site`` at the start of every Python process of a bare-metal Megatron job
(hpcllm.models.megatron_compat.run_script puts this folder on ``PYTHONPATH``): the children
that multiprocessing starts with spawn or forkserver (Megatron's checkpoint writer's
results queue is a spawn Manager) run pretrain_gpt.py's imports again, and on Python 3.11
``from typing import override`` fails there without it. Then the ``sitecustomize`` this
one hides, if any (a site's or an environment's), runs as it would have."""

import importlib.machinery
import importlib.util
import os
import sys
import typing

if not hasattr(typing, "override"):  # Python < 3.12: as megatron_compat.enable()
    try:
        import typing_extensions

        typing.override = typing_extensions.override
    except ImportError:  # the job's own error then names the missing import
        pass

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
