"""A campaign file written before training's rooms names its classes at their old module
paths (hpcllm.training.chain, .segment, .planner, .data); a chain already queued in Slurm
reads it with the code of now, and runs the old command line
``python -m hpcllm.training.chain``."""

from __future__ import annotations

import pickle
import subprocess
import sys

from hpcllm.models.planner import Layout
from hpcllm.training.campaign import chain
from hpcllm.training.plan.data import Blend
from hpcllm.training.plan.experiment import Prepared

OLD = {
    b"hpcllm.training.campaign.chain": b"hpcllm.training.chain",
    b"hpcllm.training.plan.experiment": b"hpcllm.training.segment",
    b"hpcllm.models.planner": b"hpcllm.training.planner",
    b"hpcllm.training.plan.data": b"hpcllm.training.data",
}


def test_a_campaign_file_with_the_old_module_paths_loads(tmp_path):
    prepared = Prepared(
        experiment={"segments": 2},
        layout=Layout(gpus=1, tp=1, pp=1, dp=1, micro_batch=1, global_batch=4),
        blend=Blend(("data/tokenized/t/a_text_document",), (1.0,)),
        tokenizer_files=("vocab.json", "merges.txt"),
        eod_token="<|endoftext|>",
        memory_gb=1.5,
    )
    campaign = chain.Campaign(
        name="x",
        prepared=prepared,
        cluster=None,
        workdir=str(tmp_path),
        container=None,
        sbatch=[],
        max_attempts=2,
    )
    data = pickle.dumps(campaign, protocol=0)  # module names as text lines
    for new, old in OLD.items():
        assert b"c" + new + b"\n" in data
        data = data.replace(b"c" + new + b"\n", b"c" + old + b"\n")
    path = tmp_path / "campaign.pickle"
    path.write_bytes(data)
    assert chain.load(path) == campaign


def test_the_old_command_line_runs_the_chain():
    proc = subprocess.run(
        [sys.executable, "-m", "hpcllm.training.chain", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "step" in proc.stdout and "resume" in proc.stdout
