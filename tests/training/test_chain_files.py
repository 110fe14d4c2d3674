"""Issue 51 item 9: the chain's own files malformed. The shared squeue listing
(``.snakemake/hpcllm/squeue.json``, a cache) is ignored with a one-line warning naming it
and written anew from squeue; the campaign file (``checkpoints/<exp>/chain/
campaign.pickle``) gets a message naming it and the way out, never a raw
UnpicklingError/TypeError/KeyError."""

from __future__ import annotations

import json
import logging
import pickle

import pytest
from test_chain import fake_slurm, three_segments

from hpcllm.training.campaign import chain


@pytest.mark.parametrize(
    "text",
    [
        "\x00garbage",
        "[]",
        '{"time": "yesterday", "jobs": []}',
        '{"time": 1e18, "jobs": [1]}',
        '{"time": 1e18, "jobs": [{"id": "9"}]}',
        '{"time": 1e18, "jobs": {"id": "9"}}',
    ],
    ids=["bytes", "list", "time-text", "job-number", "job-fields", "jobs-mapping"],
)
def test_a_malformed_shared_listing_is_ignored_naming_it_and_rewritten(
    text, tmp_path, monkeypatch, caplog
):
    name = chain.job_name_of(tmp_path, "tiny_local")
    fake_slurm(tmp_path, monkeypatch, squeue=f"echo '57|RUNNING|(null)|None|{name}'")
    shared = tmp_path / ".snakemake/hpcllm/squeue.json"
    shared.parent.mkdir(parents=True)
    shared.write_text(text)
    with caplog.at_level(logging.WARNING):
        jobs = chain.chain_jobs(name, shared, max_age=1e9)
    assert [j["id"] for j in jobs] == ["57"]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(f"{shared}: ignored, not a squeue listing"), warning
    assert json.loads(shared.read_text())["jobs"][0]["name"] == name  # written anew


@pytest.mark.parametrize("damage", ["garbage", "truncated", "not-a-campaign"])
def test_a_malformed_campaign_file_is_named_with_the_way_out(damage, tmp_path, capsys):
    campaign = three_segments(tmp_path, reached=4)
    chain.save(campaign)
    path = campaign.file()
    if damage == "garbage":
        path.write_bytes(b"\x80\x05garbage")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:40])
    else:
        path.write_bytes(pickle.dumps({"name": "tiny_local"}))
    with pytest.raises(chain.ChainError) as refused:
        chain.load(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: not a readable campaign file"), message
    assert "`hpcllm cancel-training tiny_local`" in message, message
    # the chain's commands (a chain job, the controller's resume): the message, exit 1
    for command in ("step", "resume"):
        assert chain.main([command, str(path)]) == 1
    assert f"{path}: not a readable campaign file" in capsys.readouterr().err


def test_a_chain_job_reads_an_intact_campaign_file_as_its_own_module(tmp_path):
    """A chain job runs `python -m hpcllm.training.campaign.chain step`: this module as
    __main__, whose Campaign is another class than the file's. An intact file is read."""
    import subprocess
    import sys

    campaign = three_segments(tmp_path, reached=12)  # complete: the job ends at once
    chain.save(campaign)
    proc = subprocess.run(
        [sys.executable, "-m", "hpcllm.training.campaign.chain", "step", str(campaign.file())],
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "every segment is committed; nothing to train" in proc.stderr, proc.stderr
