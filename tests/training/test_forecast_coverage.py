"""How well a campaign's recorded predictions held (the results page's coverage sentence)
and the plot of them against what happened (issue 48), from segment records built here."""

from __future__ import annotations

import pytest

from hpcllm.training.campaign.forecast_coverage import (
    coverage,
    coverage_sentence,
    forecast_rows,
)
from hpcllm.training.campaign.forecast_plot import forecast_series, plot_forecast

T0 = 1_790_000_000.0


def record(k: int, segments: int, ended: float | None, prediction: dict | None = None) -> dict:
    timing = {"job": {"started": T0 + 250 * (k - 1)}}
    if ended is not None:
        timing["ended"] = T0 + ended
    if prediction is not None:
        timing["prediction"] = {
            key: (T0 + v if isinstance(v, (int, float)) else v) for key, v in prediction.items()
        }
    return {"segment": k, "segments": segments, "timing": timing}


def finished_campaign() -> list[dict]:
    """4 segments, the last ended at T0 + 1000; segments 2 to 4 predicted the finish:
    inside its interval (error 50 s of 750 s left), outside it (100 of 500), without one
    (10 of 250)."""
    return [
        record(1, 4, 250),
        record(2, 4, 510, {"made_at": 250, "segment_end": 500, "campaign_end": 950,
                           "campaign_low": 900, "campaign_high": 1100}),
        record(3, 4, 740, {"made_at": 500, "segment_end": 760, "campaign_end": 1100,
                           "campaign_low": 1050, "campaign_high": 1200}),
        record(4, 4, 1000, {"made_at": 750, "segment_end": 1010, "campaign_end": 1010}),
    ]  # fmt: skip


def test_a_finished_campaign_says_how_many_intervals_held_and_the_median_error():
    rows = forecast_rows(finished_campaign())
    c = coverage(rows)
    assert c.campaign_ended and c.predictions == 3 and c.without_interval == 1
    assert c.inside == 1  # the prediction without an interval never counts inside
    assert c.median_error == pytest.approx(50 / 750)  # of 50/750, 100/500, 10/250
    assert coverage_sentence(c) == (
        "The actual end fell inside the stated 80 % interval in 1 of 3 predictions (1 of "
        "them stated no interval); median error 6.7 % of the time that was left."
    )


def test_no_prediction_says_so():
    records = [record(1, 2, 250), record(2, 2, 500)]
    assert forecast_rows(records) == [] and forecast_rows([]) == []
    c = coverage([])
    assert c.predictions == 0 and not c.campaign_ended and c.inside is None
    assert coverage_sentence(c) == (
        "No segment's record holds a prediction of the campaign's finish yet."
    )


def test_a_campaign_not_finished_judges_only_the_segments_that_ended():
    """Segments 1 to 3 of 4 recorded: the finish is not known, so no campaign prediction
    is judged; the segments' own ends are (errors 10 s of 260 s, 20 of 240)."""
    records = finished_campaign()[:3]
    c = coverage(forecast_rows(records))
    assert not c.campaign_ended and c.inside is None and c.median_error is None
    assert c.predictions == 2 and c.segments_ended == 2 and c.segments_with_interval == 0
    assert c.segment_median_error == pytest.approx((10 / 260 + 20 / 240) / 2)
    assert coverage_sentence(c) == (
        "The campaign has not finished: its 2 predictions of the finish are judged once it "
        "has. 2 segments have ended since predicting their own end (a segment's prediction "
        "states no interval for it); median error 6.1 % of the time that was left."
    )
    # where a prediction states the segment end's interval, it is counted
    records[1]["timing"]["prediction"] |= {"segment_low": T0 + 490, "segment_high": T0 + 520}
    records[2]["timing"]["prediction"] |= {"segment_low": T0 + 750, "segment_high": T0 + 800}
    c = coverage(forecast_rows(records))
    assert (c.segments_with_interval, c.segments_held) == (2, 1)
    assert "2 segments have ended since predicting their own end: 1 of 2 with a stated " \
        "interval ended inside it;" in coverage_sentence(c)  # fmt: skip
    # the running segment 2 of 2: nothing has ended since its prediction
    running = [record(1, 2, 250), record(2, 2, None, {"made_at": 250, "segment_end": 500,
                                                      "campaign_end": 500})]  # fmt: skip
    text = coverage_sentence(coverage(forecast_rows(running)))
    assert text.endswith("its 1 prediction of the finish is judged once it has. No segment "
                         "that predicted its own end has ended yet.")  # fmt: skip


def test_the_plot_draws_each_prediction_and_the_actual_finish(tmp_path):
    rows = forecast_rows(finished_campaign())
    out = tmp_path / "forecast.png"
    drawn = plot_forecast("tiny", rows, out)
    assert out.read_bytes().startswith(b"\x89PNG")
    assert drawn["campaign finish predicted (80 % interval)"] == [
        (T0 + 250, T0 + 950, T0 + 900, T0 + 1100),
        (T0 + 500, T0 + 1100, T0 + 1050, T0 + 1200),
        (T0 + 750, T0 + 1010, None, None),
    ]
    assert drawn["segment end predicted"] == [(T0 + 250, T0 + 500), (T0 + 500, T0 + 760),
                                              (T0 + 750, T0 + 1010)]  # fmt: skip
    assert drawn["segment end actual"][-1] == (T0 + 750, T0 + 1000)
    assert drawn["actual finish"] == [(T0 + 1000,)]
    assert "latest prediction (not yet known)" not in drawn


def test_before_the_end_the_latest_prediction_is_drawn_as_not_known_unless_stalled(tmp_path):
    rows = forecast_rows(finished_campaign()[:3])
    series = forecast_series(rows)
    assert series["latest prediction (not yet known)"] == [(T0 + 1100,)]  # segment 3's
    assert "actual finish" not in series
    stalled = plot_forecast("tiny", rows, tmp_path / "stalled.png", stalled=True)
    assert "latest prediction (not yet known)" not in stalled and "actual finish" not in stalled
    assert len(stalled["campaign finish predicted (80 % interval)"]) == 2  # history stays
    # nothing recorded: the file is still written (the page rule's output), and says so
    empty = plot_forecast("tiny", [], tmp_path / "empty.png")
    assert (tmp_path / "empty.png").read_bytes().startswith(b"\x89PNG")
    assert not any(empty.values())


def check_the_page_of_a_finished_campaign(work, name: str, config_files: list[str]) -> str:
    """The results page of a campaign the workflow ran in ``work`` (profiles/local), built
    from its own records as the page rule builds it: the plot drawn and embedded, and the
    coverage sentence's numbers those of its records. Called by workflow tests that ran
    one (tests/training/test_workflow_training.py); returns the page."""
    import base64
    import json
    import statistics

    from hpcllm.clusters import load_cluster
    from hpcllm.results_page import experiment_view, render_page
    from hpcllm.training.campaign.status import load_config
    from hpcllm.training.plan.experiment import prepare_experiment

    config = load_config(work, config_files, "profiles/local")
    prepared = prepare_experiment(
        name,
        config["training"]["experiments"][name],
        config["text"],
        load_cluster("local", work / "config" / "clusters"),
    )
    png = work / f"results/train/{name}/forecast.png"
    page = render_page("t", None, {}, [experiment_view(work, name, prepared, None, None, png)])
    assert f'src="data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()}"' in page
    timings = [
        json.loads(p.read_text())["timing"]
        for p in sorted((work / f"results/train/{name}").glob("seg*.json"))
    ]
    end = timings[-1]["ended"]
    made = [t["prediction"] for t in timings if t.get("prediction")]
    assert made, "no segment of the campaign predicted its finish"
    inside = sum(p["campaign_low"] <= end <= p["campaign_high"] for p in made)
    error = statistics.median(abs(p["campaign_end"] - end) / (end - p["made_at"]) for p in made)
    n = f"{len(made)} prediction{'s' * (len(made) != 1)}"
    sentence = (
        f"<p>The actual end fell inside the stated 80 % interval in {inside} of {n}; median "
        f"error {100 * error:.1f} % of the time that was left.</p>"
    )
    assert sentence in page, page[page.index("When it will finish") :][:3000]
    return page
