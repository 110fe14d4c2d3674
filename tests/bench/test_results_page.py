"""The results page: tables first, then the figures, then each experiment; self-contained."""

import base64
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
