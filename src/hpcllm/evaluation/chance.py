"""The chance level of a task: the accuracy (acc, acc_norm) of picking a choice at random.

Measured by the tasks job from lm-eval's task data (the mean over the items scored of 1 /
the item's number of choices); a record without it (written before it was measured)
takes the level of a known task from :data:`KNOWN`.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

# The metrics whose chance level this is: accuracies of a multiple-choice task.
METRICS = {"acc", "acc_norm", "acc_bytes"}

# 1 / the choices per item of lm-eval's common multiple-choice tasks, with the source.
KNOWN = {
    # ARC: 4 answer options for nearly all questions (Clark et al. 2018, arXiv:1803.05457)
    "arc_easy": 0.25,
    "arc_challenge": 0.25,
    "hellaswag": 0.25,  # 4 endings per context (Zellers et al. 2019, arXiv:1905.07830)
    "piqa": 0.5,  # 2 solutions per goal (Bisk et al. 2020, arXiv:1911.11641)
    "winogrande": 0.5,  # 2 options per sentence (Sakaguchi et al. 2020, arXiv:1907.10641)
    "boolq": 0.5,  # yes or no (Clark et al. 2019, arXiv:1905.10044)
    "openbookqa": 0.25,  # 4 choices per question (Mihaylov et al. 2018, arXiv:1809.02789)
    "sciq": 0.25,  # 4 answer options (Welbl et al. 2017, arXiv:1707.06209)
    "copa": 0.5,  # 2 alternatives (Roemmele et al. 2011, AAAI Spring Symposium)
    # 4 choices per question (Hendrycks et al. 2021, arXiv:2009.03300); its mmlu_* tasks
    "mmlu": 0.25,
    # 4 descriptions per module (resources/eval_tasks/make_module_purpose.py)
    "module_purpose": 0.25,
}


def known_chance(task: str) -> float | None:
    return KNOWN.get(task, KNOWN["mmlu"] if task.startswith("mmlu_") else None)


def chance_level(task: Any, limit: int | float | None) -> float | None:
    """``task`` (an lm-eval Task as the evaluation loads it): the mean of 1 / choices over
    the items lm-eval scores (its first ``limit``); None for a task without choices."""
    from lm_eval.evaluator_utils import get_sample_size

    if task.OUTPUT_TYPE != "multiple_choice":
        return None
    docs = task.eval_docs
    n = get_sample_size(task, limit)
    counts = [len(task.doc_to_choice(doc)) for doc in islice(docs, n)]
    return sum(1 / c for c in counts) / len(counts) if counts else None
