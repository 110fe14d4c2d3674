"""The vision benchmark's trainer in one process on real packed images: its records hold
EPICURE's timings, validation on the whole val split, stage-in, and no energy on a CPU."""

from __future__ import annotations

import json

import pytest

from hpcllm.bench import vision_train


def test_one_process_run_logs_epicure_records(packed, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HPCLLM_RUN_ID", "unit")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    settings = {
        "model": "resnet_tiny",
        "precision": "fp32",
        "batch_per_gpu": 3,
        "image_size": 32,
        "epochs": 2,
        "workers": 0,
        "stage_in": True,
        "warmup_epochs": 1,
    }
    local = tmp_path / "local"
    local.mkdir()
    vision_train.run(settings, str(packed / "train.lmdb"), str(packed / "val.lmdb"), str(local))
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    start = records[0]
    assert start["event"] == "start" and start["model_impl"] == "transformers"
    assert start["samples"] == 12 and start["val_samples"] == 6
    assert start["batches_per_epoch"] == 4 and start["energy_counter"] is False
    assert start["learning_rate_scaled"] == pytest.approx(0.1 * 3 / 256)
    stage = records[1]
    assert stage["event"] == "stage_in" and stage["method"] == "copy"
    (seconds,) = stage["seconds_per_node"].values()
    (folder,) = stage["dirs"].values()
    assert seconds > 0 and folder.startswith(str(local))
    assert list(local.iterdir()) == []  # the copies are removed at the end
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [e["epoch"] for e in epochs] == [1, 2]
    for e in epochs:
        times = [r["time_s"] for r in records if r["event"] == "batch" and r["epoch"] == e["epoch"]]
        assert len(times) == 4
        # batch times run from start to start: together no longer than the training part
        assert 0 < sum(times) <= e["train_time_s"] < e["epoch_time_s"]
        assert e["epoch_time_s"] == pytest.approx(e["train_time_s"] + e["val_time_s"])
        assert e["val_images"] == 6 and 0 <= e["val_top1"] <= e["val_top5"] <= 1
        assert e["images"] == 12 and "energy_j" not in e  # no counters on a CPU
    assert records[-1] == {"event": "end"}
