"""Imported first by every job script: ``hpcllm`` from the checkout that planned the run.

Snakemake appends this folder to the end of ``sys.path`` (after site-packages), so an
installed ``hpcllm`` (another version in the environment, a container's copy) would win;
this puts the checkout's ``src`` first. Snakemake unpickles the job's params before the
script runs, which can import ``hpcllm`` already: such modules are dropped and imported
again from the checkout.
"""

import os
import sys

SRC = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))), "src"
)
if sys.path[0] != SRC:
    sys.path.insert(0, SRC)
for _name in [m for m in sys.modules if m == "hpcllm" or m.startswith("hpcllm.")]:
    if not os.path.realpath(getattr(sys.modules[_name], "__file__", None) or SRC).startswith(SRC):
        del sys.modules[_name]
