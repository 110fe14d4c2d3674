"""How well a campaign's recorded predictions held, for the results page: the share of
predictions whose stated 80 % interval held the campaign's actual end, and the median
error as a share of the time that was left when each was made.

Read from the segment records (each holds the prediction its job made at its start,
:func:`hpcllm.training.campaign.calendar.prediction_rows`). The campaign's predictions
are judged only once it has ended; before that, the segments' predictions of their own
end, where their segment has ended.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpcllm.training.campaign.calendar import INTERVAL, prediction_rows


def forecast_rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """:func:`prediction_rows`, with the segment end's own interval where the prediction
    states one (``segment_low``/``segment_high``; None where it does not)."""
    stated = {}
    for rec in records:
        p = (rec.get("timing") or {}).get("prediction") or {}
        stated[rec.get("segment")] = (p.get("segment_low"), p.get("segment_high"))
    rows = prediction_rows(records)
    for row in rows:
        row["segment_low"], row["segment_high"] = stated.get(row["segment"], (None, None))
    return rows


@dataclass(frozen=True)
class Coverage:
    campaign_ended: bool
    predictions: int  # records with a prediction of the campaign's end
    without_interval: int  # of them, those that stated no interval (never counted inside)
    inside: int | None  # the actual end inside the stated interval; None: not ended yet
    median_error: float | None  # |predicted - actual| / (actual - made_at); None: not known
    segments_ended: int  # segment-end predictions whose segment has ended
    segments_with_interval: int  # of them, those that stated an interval for that end
    segments_held: int  # of those, the segment's actual end inside it
    segment_median_error: float | None  # |error| / (actual segment end - made_at)


def _inside(value: float, low: float | None, high: float | None) -> bool:
    return low is not None and high is not None and low <= value <= high


def _share(predicted: float, actual: float, made_at: float) -> float | None:
    left = actual - made_at
    return abs(predicted - actual) / left if left > 0 else None


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def coverage(rows: Sequence[Mapping[str, Any]]) -> Coverage:
    """How the predictions in ``rows`` (:func:`forecast_rows`) held."""
    made = [r for r in rows if r.get("campaign_predicted") is not None]
    actual = next((r["campaign_actual"] for r in rows if r.get("campaign_actual")), None)
    without = sum(r.get("campaign_low") is None or r.get("campaign_high") is None for r in made)
    inside = errors = None
    if actual is not None:
        inside = sum(_inside(actual, r.get("campaign_low"), r.get("campaign_high")) for r in made)
        errors = [_share(r["campaign_predicted"], actual, r["made_at"]) for r in made]
    ended = [r for r in rows if r.get("segment_actual") and r.get("segment_predicted") is not None]
    stated = [r for r in ended if r.get("segment_low") is not None and r.get("segment_high")]
    return Coverage(
        campaign_ended=actual is not None,
        predictions=len(made),
        without_interval=without,
        inside=inside,
        median_error=_median(errors or []),
        segments_ended=len(ended),
        segments_with_interval=len(stated),
        segments_held=sum(
            _inside(r["segment_actual"], r["segment_low"], r["segment_high"]) for r in stated
        ),
        segment_median_error=_median(
            [_share(r["segment_predicted"], r["segment_actual"], r["made_at"]) for r in ended]
        ),
    )


def _percent(share: float) -> str:
    return f"{100 * share:.1f} %"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def coverage_sentence(c: Coverage) -> str:
    """The coverage in words, for the results page."""
    interval = f"{INTERVAL * 100:.0f} % interval"
    if not c.predictions:
        return "No segment's record holds a prediction of the campaign's finish yet."
    if c.campaign_ended:
        text = (
            f"The actual end fell inside the stated {interval} in {c.inside} of "
            f"{_plural(c.predictions, 'prediction')}"
        )
        if c.without_interval:
            text += f" ({c.without_interval} of them stated no interval)"
        if c.median_error is not None:
            text += f"; median error {_percent(c.median_error)} of the time that was left"
        return text + "."
    text = (
        f"The campaign has not finished: its {_plural(c.predictions, 'prediction')} of the "
        f"finish {'is' if c.predictions == 1 else 'are'} judged once it has."
    )
    if not c.segments_ended:
        return text + " No segment that predicted its own end has ended yet."
    one = c.segments_ended == 1
    ended = (
        f"{_plural(c.segments_ended, 'segment')} {'has' if one else 'have'} ended since "
        f"predicting {'its' if one else 'their'} own end"
    )
    held = (
        f" {ended}: {c.segments_held} of {c.segments_with_interval} with a stated "
        "interval ended inside it"
        if c.segments_with_interval
        else f" {ended} (a segment's prediction states no interval for it)"
    )
    if c.segment_median_error is not None:
        held += f"; median error {_percent(c.segment_median_error)} of the time that was left"
    return text + held + "."
