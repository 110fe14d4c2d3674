"""A batch of shards in one job: side by side, a failed shard alone redone, same bytes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpcllm.text.sample_corpus import write_jsonl_zst
from hpcllm.text.shard_pool import (
    ShardPoolError,
    ShardTask,
    batch_minutes,
    check_batch_outputs,
    overlapping,
    read_record,
    run_batch,
    shard_done,
    write_batch_record,
)
from hpcllm.text.tokenization import load_tokenizer, tokenize_shard

EOD = "<|endoftext|>"
WORK = "hpcllm.text.shard_pool:tokenize_source_task"  # what tokenize_batch runs
SETTINGS = {
    "append_eod": True,
    "encoder": "auto",
    "batch_bytes": 1 << 16,
    "special_tokens_in_text": "text",
}


def make_shards(tmp_path: Path, texts: list[str], n: int) -> list[Path]:
    paths = []
    for i in range(n):
        p = tmp_path / "raw" / f"{i:04d}.jsonl.zst"
        p.parent.mkdir(parents=True, exist_ok=True)
        # Every shard several thousand documents: long enough that the two processes'
        # tokenizing overlaps even when spawning one is slow on a loaded machine.
        part = texts[i::n] * 3
        write_jsonl_zst(((str(j), t) for j, t in enumerate(part)), p)
        paths.append(p)
    return paths


def tasks_for(tmp_path: Path, shards: list[Path], tokenizer: Path, settings=SETTINGS):
    """The batch's tasks as workflow/scripts/tokenize_batch.py makes them: shard k of a
    local source over ``shards`` (one file each) read in place."""
    cfg = {"type": "files", "tokenizer_json": str(tokenizer), "eod_token": EOD}
    source = {"type": "local", "files": [str(p) for p in shards]}
    return [
        ShardTask(
            name=p.name.split(".")[0],
            prefix=str(tmp_path / "tok" / f"{p.name.split('.')[0]}_text_document"),
            inputs=(str(p), str(tokenizer)),
            log=str(tmp_path / "logs" / f"{p.name.split('.')[0]}.log"),
            kwargs={
                "source": "pool",
                "cfg": source,
                "defaults": {},
                "shard": k,
                "num_shards": len(shards),
                "prefix": str(tmp_path / "tok" / f"{p.name.split('.')[0]}_text_document"),
                "tokenizer": cfg,
                "tokenizer_files": [str(tokenizer)],
                "settings": settings,
            },
            suffixes=(".bin", ".idx", ".manifest.json"),
        )
        for k, p in enumerate(shards)
    ]


def outputs_stat(task: ShardTask) -> list[tuple[int, int]]:
    return [(os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in task.outputs()]


def test_shards_run_side_by_side_with_the_bytes_of_a_serial_run(
    tmp_path, sample_texts, trained_tokenizer
):
    (tmp_path / "tok").mkdir()
    shards = make_shards(tmp_path, sample_texts, 2)
    tasks = tasks_for(tmp_path, shards, trained_tokenizer)
    result = run_batch(tasks, WORK, workers=2)
    assert sorted(result.done) == ["0000", "0001"] and result.skipped == []
    records = [read_record(t.prefix) for t in tasks]
    assert overlapping(records), records
    tok = load_tokenizer(trained_tokenizer)
    for task, shard in zip(tasks, shards):
        serial = tmp_path / "serial" / task.name
        serial.parent.mkdir(exist_ok=True)
        tokenize_shard(shard, serial, tok, EOD, batch_bytes=SETTINGS["batch_bytes"])
        # tokenize_shard reads the file as a JSONL shard of its own: an independent reading.
        for ext in (".bin", ".idx"):
            assert Path(task.prefix + ext).read_bytes() == Path(f"{serial}{ext}").read_bytes()
        assert json.loads(Path(task.prefix + ".manifest.json").read_text())["documents"] > 0
        assert f"shard {task.name} done" in Path(task.log).read_text()
    # A second run finds every shard done and touches nothing.
    before = [outputs_stat(t) for t in tasks]
    again = run_batch(tasks, WORK, workers=2)
    assert again.done == [] and sorted(again.skipped) == ["0000", "0001"]
    assert [outputs_stat(t) for t in tasks] == before


def test_a_failed_shard_leaves_the_others_and_a_rerun_redoes_it_alone(
    tmp_path, sample_texts, trained_tokenizer
):
    (tmp_path / "tok").mkdir()
    shards = make_shards(tmp_path, sample_texts, 3)
    good = shards[1].read_bytes()
    shards[1].write_bytes(good[: len(good) // 2])  # a truncated compressed file
    tasks = tasks_for(tmp_path, shards, trained_tokenizer)
    with pytest.raises(ShardPoolError, match=r"1 of 3 shard\(s\) failed") as e:
        run_batch(tasks, WORK, workers=2)
    # The shard's reason in the batch's error: what the terminal and the summary show.
    assert f"shard 0001: exit code 1, log {tasks[1].log}: CorruptInput: " in str(e.value)
    assert "truncated or corrupt" in str(e.value).split("shard 0001")[1]
    assert "truncated or corrupt" in Path(tasks[1].log).read_text()
    assert not any(p.exists() for p in tasks[1].outputs()) and not tasks[1].record.exists()
    kept = {t.name: outputs_stat(t) for t in (tasks[0], tasks[2])}

    shards[1].write_bytes(good)  # fixed: the rerun redoes shard 0001 only
    result = run_batch(tasks, WORK, workers=2)
    assert result.done == ["0001"] and sorted(result.skipped) == ["0000", "0002"]
    assert {t.name: outputs_stat(t) for t in (tasks[0], tasks[2])} == kept
    assert all(p.exists() for p in tasks[1].outputs())


def test_a_shard_is_redone_when_its_settings_or_outputs_change(
    tmp_path, sample_texts, trained_tokenizer
):
    (tmp_path / "tok").mkdir()
    shards = make_shards(tmp_path, sample_texts[:200], 2)
    tasks = tasks_for(tmp_path, shards, trained_tokenizer)
    run_batch(tasks, WORK, workers=1)
    changed = tasks_for(tmp_path, shards, trained_tokenizer, {**SETTINGS, "append_eod": False})
    assert run_batch(changed[:1] + tasks[1:], WORK, workers=1).done == ["0000"]
    Path(tasks[1].prefix + ".bin").write_bytes(b"")  # damaged output
    assert run_batch(changed[:1] + tasks[1:], WORK, workers=1).done == ["0001"]
    assert shard_done(tasks[1])
    # An output the shard should have written (its own manifest) is missing: not done.
    Path(tasks[1].prefix + ".manifest.json").unlink()
    assert not shard_done(tasks[1])


def test_a_shard_deleted_after_its_batch_is_named_and_redone_alone(
    tmp_path, sample_texts, trained_tokenizer
):
    """Snakemake sees only the batch's record: the merge's check names a shard whose files
    went missing or changed since, and the way to redo it alone."""
    (tmp_path / "tok").mkdir()
    shards = make_shards(tmp_path, sample_texts[:300], 3)
    tasks = tasks_for(tmp_path, shards, trained_tokenizer)
    batch = tmp_path / "tok" / "batch0000.json"
    write_batch_record(batch, tasks, run_batch(tasks, WORK, workers=2))
    check_batch_outputs(batch)  # as written: fine
    Path(tasks[1].prefix + ".bin").unlink()
    Path(tasks[2].prefix + ".idx").write_bytes(b"\0" * 40)
    with pytest.raises(ShardPoolError) as e:
        check_batch_outputs(batch)
    message = str(e.value)
    assert f"shard 0001: {tasks[1].prefix}.bin missing" in message, message
    assert "shard 0002:" in message and "changed since the batch ran" in message
    assert "shard 0000" not in message and f"Delete {batch}" in message
    kept = outputs_stat(tasks[0])
    batch.unlink()  # what the message says; then the batch job again
    result = run_batch(tasks, WORK, workers=2)
    assert sorted(result.done) == ["0001", "0002"] and result.skipped == ["0000"]
    assert outputs_stat(tasks[0]) == kept
    write_batch_record(batch, tasks, result)
    check_batch_outputs(batch)


def test_repeated_shard_names_are_refused(tmp_path, trained_tokenizer):
    shards = [tmp_path / "a.jsonl.zst", tmp_path / "a.jsonl.zst"]
    with pytest.raises(ValueError, match="shard names repeat"):
        run_batch(tasks_for(tmp_path, shards, trained_tokenizer), WORK, workers=2)


def test_the_time_limit_comes_from_the_batch_work():
    # 12 shards of 10 GB at 10 MB/s on 12 workers: one shard's time (1000 s, x1.5, plus
    # 5 minutes start-up, rounded up to 5 minutes); on 6 workers two shards' time.
    one = batch_minutes([10**10] * 12, workers=12, mb_per_s=10)
    assert one == 30
    assert batch_minutes([10**10] * 12, workers=6, mb_per_s=10) == 55
    # The biggest shard decides: one 40 GB shard among small ones.
    assert batch_minutes([4 * 10**10] + [10**6] * 11, workers=12, mb_per_s=10) == 105
    # At most the partition's longest limit.
    assert batch_minutes([10**10] * 12, workers=1, mb_per_s=10, max_minutes=240) == 240


def test_a_killed_shard_process_fails_that_shard_only(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent / "pool_work"))
    tasks = [
        ShardTask(
            name=name,
            prefix=str(tmp_path / name),
            inputs=(),
            log=str(tmp_path / f"{name}.log"),
            kwargs={"prefix": str(tmp_path / name), "kill": name == "0001"},
        )
        for name in ("0000", "0001", "0002")
    ]
    with pytest.raises(ShardPoolError, match=r"shard 0001: exit code -9") as e:
        run_batch(tasks, "pool_work:work", workers=3)
    assert "0000" not in str(e.value) and "0002" not in str(e.value)
    assert shard_done(tasks[0]) and shard_done(tasks[2]) and not shard_done(tasks[1])
