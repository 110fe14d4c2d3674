"""Which reasons of a segment job ask for new training (hpcllm.training.plan.reruns)."""

from hpcllm.training.plan.reruns import asked, stale_reruns


def test_forced_by_the_user_or_new_data_asks_the_segments_record_or_image_does_not():
    assert asked("x", True, [], []) == ["forced"]
    data = "data/tokenized/bpe/en_text_document.bin"
    assert asked("x", False, [data], []) == ["updated input files"]
    assert asked("x", False, [], [data]) == ["input files updated by another job"]
    # the segment before's record (its own rerun), a new image, the pre-flight: no
    not_data = ["results/train/x/seg1.json", "containers/megatron.sif", "results/preflight/p.json"]
    assert asked("x", False, not_data, not_data) == []


def test_only_segments_whose_target_the_checkpoint_holds_are_stale():
    planned = [("x", 1, ["forced"]), ("x", 2, []), ("x", 3, ["updated input files"])]
    found = stale_reruns(planned, reached=lambda e: 20, target=lambda e, k: 10 * k)
    assert found == {"x": [(1, "forced (--forcerun, -R or -F)")]}  # 3's target is past 20
    assert stale_reruns(planned, reached=lambda e: None, target=lambda e, k: 10 * k) == {}
