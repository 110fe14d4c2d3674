"""The results page: tables first, then the figures, then each experiment; self-contained."""

import base64
import json
import re

from test_summary_plots import DATA, point, put_run, scaled_log

from hpcllm.bench.plots import PLOTS, plot_all
from hpcllm.bench.summary import summarize
from hpcllm.results_page import ExperimentView, render_page, write_page


def test_results_page_shows_tables_then_figures_then_experiments(tmp_path):
    results = tmp_path / "results"
    points = [point(1), point(2), point(4)]
    put_run(results, points[0], scaled_log(1.0))
    put_run(results, points[1], scaled_log(1.0))
    put_run(results, points[2], (DATA / "megatron_oom.log").read_text(), {"returncode": 1})
    df = summarize(points, results)
    plots = {name: tmp_path / f"{name}.png" for name in PLOTS}
    plot_all(df, plots)
    view = ExperimentView(
        "tiny", {"segments done": "2 of 3", "tokens trained": "1,024"}, plots["loss"]
    )
    page = render_page("hpcllm results (local)", df, plots, [view])
    write_page(tmp_path / "index.html", page)
    text = (tmp_path / "index.html").read_text()

    # reading order: the benchmark table, then the figures, then the experiment
    table, figure = text.index("<table>"), text.index("<img")
    assert text.index('id="benchmarks"') < table < figure < text.index('id="exp-tiny"')
    assert "2 of 3 runs ok." in text
    headers = re.findall(r"<th>([^<]*)</th>", text[table : text.index("</thead>")])
    assert headers[:3] == ["experiment", "model", "scaling"] and "status" in headers
    assert "2658.3" in text and "2658.27" not in text  # rounded
    assert text.count('<tr class="bad">') == 1 and "out_of_memory" in text
    # every figure is embedded: the file is the page alone
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    assert len(embedded) == len(PLOTS) + 1
    assert base64.b64decode(embedded[0]) == plots["efficiency"].read_bytes()
    assert '<th class="text">segments done</th><td>2 of 3</td>' in text
    assert 'src="' not in text.replace('src="data:', "")  # no link to another file


def test_results_page_without_runs_says_so(tmp_path):
    page = render_page("hpcllm results", None, {}, [])
    assert "Nothing has been benchmarked or trained yet." in page


def _language_summary(tmp_path, **columns):
    results = tmp_path / "results"
    points = [point(1), point(2)]
    for p in points:
        put_run(results, p, scaled_log(1.0))
    df = summarize(points, results)
    for name, value in columns.items():
        df[name] = value
    return df


def test_a_run_that_trained_shows_training_first_with_contents_linking_every_section(
    tmp_path,
):
    """Issue 31: training was three screens down, below the benchmark tables and figures."""
    df = _language_summary(tmp_path)
    plots = {"efficiency": tmp_path / "efficiency.png"}
    plots["efficiency"].write_bytes(b"\x89PNG\r\n\x1a\n")
    trained = ExperimentView("tiny", {"segments done": "1 of 3"}, None, trained=True)
    text = render_page("hpcllm results", df, plots, [trained])
    assert text.index('id="training"') < text.index('id="exp-tiny"') < text.index('id="benchmarks"')
    # the contents come before both sections and link each section and subsection
    nav = text[text.index("<nav>") : text.index("</nav>")]
    assert text.index("</nav>") < text.index('id="training"')
    links = re.findall(r'href="#([^"]+)"', nav)
    assert links == ["training", "exp-tiny", "benchmarks", "bench-language", "bench-figures"]
    assert all(f'id="{anchor}"' in text for anchor in links)
    # an experiment that has not trained yet stays after the benchmarks
    waiting = ExperimentView("tiny", {"segments done": "0 of 3"}, None)
    text = render_page("hpcllm results", df, plots, [waiting])
    assert text.index('id="benchmarks"') < text.index('id="training"')


def test_runs_without_gpus_say_what_a_node_is_and_tflops_keep_their_digits(tmp_path):
    """Issue 31: a laptop's sweep showed TFLOP/s 0.0 and efficiencies of 0.04 with no word
    that its "nodes" are processes on the same cores."""
    from hpcllm.results_page import cluster_without_gpus

    note = 'class="note" id="no-gpus"'
    on_gpus = _language_summary(tmp_path / "gpu", gpu_model="H100")
    assert note not in render_page("t", on_gpus, {}, [])
    cpu = _language_summary(tmp_path / "cpu", gpu_model="cpu", tflops_per_gpu=0.0041234)
    text = render_page("t", cpu, {}, [])
    assert note in text and "a benchmark &ldquo;node&rdquo; is one process" in text
    assert text.index(note) < text.index('id="benchmarks"')
    assert text.count('<td class="">0.00412</td>') == 2  # three significant digits, not 0.0
    # the engines log TFLOP/s with one decimal: a logged 0.0 is below 0.05
    cpu["tflops_per_gpu"] = 0.0
    assert render_page("t", cpu, {}, []).count('<td class="">&lt; 0.05</td>') == 2
    # a training-only page on a cluster without GPUs says it too
    view = ExperimentView("tiny", {"GPU-hours": "0.02"}, None, trained=True)
    assert note in render_page("t", None, {}, [view], without_gpus=True)
    # what the workflow's script passes: the cluster's facts file (this checkout's here)
    assert cluster_without_gpus("local", tmp_path) and not cluster_without_gpus("juwels")


def two_segment_records(workdir, t0: float) -> None:
    """tiny_local's records of segments 1 and 2 (of 3), segment 2's with the prediction it
    made at its start (t0 + 600 s): its own end at t0 + 840 s (it ended at t0 + 850 s: 10 s
    late of the 250 s left) and the campaign's at t0 + 1500 s (80 % interval: t0 + 1400 s
    to t0 + 1800 s)."""
    results = workdir / "results" / "train" / "tiny_local"
    results.mkdir(parents=True)
    for k in (1, 2):
        timing = {"job": {"started": t0 + 300 * k}, "ended": t0 + 300 * k + 250}
        if k == 2:
            timing["prediction"] = {
                "made_at": t0 + 600, "segment_end": t0 + 840, "campaign_end": t0 + 1500,
                "campaign_low": t0 + 1400, "campaign_high": t0 + 1800, "line": "",
            }  # fmt: skip
        (results / f"seg{k}.json").write_text(
            json.dumps({"segment": k, "segments": 3, "last_iteration": 10 * k, "timing": timing})
        )


def test_the_experiment_view_knows_whether_it_trained(workdir):
    """What puts training first: the status `hpcllm status` computes, from the files a
    campaign leaves (tiny_local of the laptop examples, one of 3 segments done)."""
    from support import tiny_local_prepared

    from hpcllm.results_page import experiment_view

    prepared = tiny_local_prepared(workdir)
    assert not experiment_view(workdir, "tiny_local", prepared, None).trained
    (workdir / "checkpoints" / "tiny_local" / "iter_0000010").mkdir(parents=True)
    (workdir / "checkpoints" / "tiny_local" / "latest_checkpointed_iteration.txt").write_text("10")
    view = experiment_view(workdir, "tiny_local", prepared, None)
    assert view.trained and view.status["iteration"] == "10 of 30"
    assert view.status["GPU-hours"] == "0.00" and not view.predictions
    # nothing carries the campaign on (no job, no Snakemake run there): said, no date
    assert view.status["state"].startswith("stalled (no date): "), view.status
    assert "expected to finish" not in view.status

    # segment 2 predicted its end and the campaign's at its start; both records, against
    # the limit of the config
    from datetime import datetime

    t0 = datetime(2026, 11, 20, 12, 0, 0).timestamp()
    two_segment_records(workdir, t0)
    view = experiment_view(workdir, "tiny_local", prepared, None, max_gpu_hours=500)
    assert view.status["GPU-hours"] == "0.00 of max_gpu_hours 500"
    page = render_page("t", None, {}, [view])
    # predicted 12:14:00, ended 12:14:10: 10 s early; the campaign has not ended
    assert (
        "<tr><td>2</td><td>2026-11-20 12:10:00</td><td>2026-11-20 12:14:00</td>"
        "<td>2026-11-20 12:14:10</td><td>-10 s</td><td>2026-11-20 12:25:00</td>"
        "<td>2026-11-20 12:23:20 to 2026-11-20 12:30:00</td><td></td><td></td></tr>"
    ) in page, page


def test_a_stalled_campaign_s_forecast_plot_presents_no_date(workdir, tmp_path):
    """Issue 48: a stalled campaign shows no date; its plot's caption neither (and the plot
    draws no latest prediction), while the past predictions and the segment that ended
    since predicting its own end are still shown and judged."""
    from datetime import datetime

    from support import tiny_local_prepared

    from hpcllm.results_page import experiment_view

    prepared = tiny_local_prepared(workdir)
    (workdir / "checkpoints" / "tiny_local" / "iter_0000020").mkdir(parents=True)
    (workdir / "checkpoints" / "tiny_local" / "latest_checkpointed_iteration.txt").write_text("20")
    t0 = datetime(2026, 11, 20, 12, 0, 0).timestamp()
    two_segment_records(workdir, t0)
    png = tmp_path / "forecast.png"
    view = experiment_view(workdir, "tiny_local", prepared, None, forecast_png=png)
    assert view.stalled and view.status["state"].startswith("stalled (no date): ")
    page = render_page("t", None, {}, [view])
    figure = page[page.index("<figure><img") : page.index("</figure>")]
    assert base64.b64encode(png.read_bytes()).decode() in figure
    caption = figure[figure.index("<figcaption>") :]
    assert "No finish is forecast now: the campaign is not running" in caption, caption
    assert not re.search(r"\d{4}-\d\d-\d\d|\d\d?:\d\d", caption), caption
    assert (
        "<p>The campaign has not finished: its 1 prediction of the finish is judged once it "
        "has. 1 segment has ended since predicting its own end (a segment&#x27;s prediction "
        "states no interval for it); median error 4.0 % of the time that was left.</p>"
    ) in page, page[page.index("</table>") :][:600]


def test_the_headings_name_the_models_and_summary_csv_only_where_benchmarked(tmp_path):
    """Issue 40 item 12: the vision heading said ResNet-50 over a run of resnet_tiny, and
    a page where nothing was benchmarked pointed at results/bench/summary.csv."""
    for model, heading in (("resnet_tiny", "resnet_tiny"), ("resnet50", "ResNet-50")):
        p = point(1, "weak", benchmark="vision", model=model, id=f"v.{model}.weak.fp32.n0001")
        page = render_page("t", summarize([p], tmp_path / "nothing"), {}, [])
        assert f'<h3 id="bench-vision">Vision benchmark ({heading})</h3>' in page
        assert "Full tables: results/bench/summary.csv." in page
    view = ExperimentView("tiny", {"segments done": "1 of 3"}, None, trained=True)
    assert "summary.csv" not in render_page("t", None, {}, [view])
