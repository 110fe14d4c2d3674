"""At run time, before the engine starts: the experiment's data exist, match the tokenizer,
and every split gets documents."""

from __future__ import annotations

from hpcllm.training.plan.data import parse_split, sample_counts
from hpcllm.training.plan.experiment import Prepared, total_iterations


def check_segment_data(prepared: Prepared) -> None:
    """At run time: the data exist, match the tokenizer, and every split gets documents."""
    from hpcllm.text.tokenizers_config import engine_vocabulary
    from hpcllm.training.plan.data import check_blend, check_splits

    vocab_size, _ = engine_vocabulary(prepared.tokenizer_files, prepared.eod_token)
    check_blend(prepared.blend, vocab_size)
    check_splits(prepared.blend, prepared.experiment["data"]["split"], dataset_samples(prepared))


def dataset_samples(prepared: Prepared) -> list[int]:
    """Samples per split the engines ask for (a key of the index cache)."""
    exp = prepared.experiment
    samples = sample_counts(
        total_iterations(exp), prepared.layout.global_batch, exp["eval_interval"], exp["eval_iters"]
    )
    shares = parse_split(exp["data"]["split"])
    return [n if share > 0 else 0 for n, share in zip(samples, shares)]
