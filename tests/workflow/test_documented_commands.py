"""What the README and docs/ promise a user: each dry run they show with a job count plans
that many jobs in a fresh working directory (as in a fresh clone), and each DAG picture
has the jobs it states; `hpcllm status` and `snakemake --report` as the docs show them; a
user's FineWeb config plans the user's data only, `key: null` unsets a key, and the
workflow runs as a module of a project folder of the user's own, with a cluster's profile
or the local one (docs/first-project.md)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from support import REPO, hang_guard, make_workdir, run_snakemake, snakemake_bin

pytestmark = pytest.mark.workflow

# `snakemake ... -n ...   # 10 jobs` in a code block of the README or a guide
COUNTED = re.compile(r"^(snakemake [^#\n]*?\s-n\b[^#\n]*?)\s+#\s+(\d+) jobs$", re.M)
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
USER_ENV = {"HPCLLM_ACCOUNT": "myproject"}


# `snakemake ... --dag | dot -Tsvg > dag.svg   # a picture of the 27 jobs ...`
DRAWN = re.compile(
    r"^(snakemake [^#|\n]*?\s--dag\b[^#|\n]*?)\s*\|[^#\n]*#\s+a picture of the (\d+) jobs\b", re.M
)


def documented_dry_runs(pattern: re.Pattern = COUNTED) -> list[tuple[str, str, int]]:
    return [
        (doc.name, m.group(1), int(m.group(2)))
        for doc in DOCS
        for m in pattern.finditer(doc.read_text())
    ]


def documented(doc: str, pattern: str) -> str:
    """The one command of ``doc`` that ``pattern`` (a regex with one group) finds."""
    found = re.findall(pattern, (REPO / doc).read_text(), re.M)
    assert len(found) == 1, (doc, pattern, found)
    return found[0]


def planned_total(out: str) -> int:
    totals = re.findall(r"^total\s+(\d+)$", out, re.M)
    assert totals, out[-3000:]
    return int(totals[0])


def test_the_docs_state_job_counts_for_the_users_first_commands():
    found = documented_dry_runs()
    docs = {doc for doc, _, _ in found}
    # clusters.md's and training.md's plans too: each planned nothing (the empty
    # config/config.yaml) or failed (the 800M experiment without its data config)
    assert {"README.md", "first-project.md", "training.md", "clusters.md"} <= docs, found
    assert len(found) >= 7, found
    drawn = {doc for doc, _, _ in documented_dry_runs(DRAWN)}
    assert {"README.md", "clusters.md"} <= drawn, drawn


@pytest.mark.parametrize(
    "doc,command,jobs", documented_dry_runs(), ids=lambda v: str(v)[:60].replace(" ", "_")
)
def test_a_documented_dry_run_plans_the_jobs_it_states(doc, command, jobs, tmp_path):
    workdir = make_workdir(tmp_path / "work")
    proc = run_snakemake(workdir, *shlex.split(command)[1:], env=USER_ENV, examples=False)
    assert planned_total(proc.stdout + proc.stderr) == jobs, (doc, command)


@pytest.mark.parametrize(
    "doc,command,jobs", documented_dry_runs(DRAWN), ids=lambda v: str(v)[:60].replace(" ", "_")
)
def test_a_documented_dag_picture_has_the_jobs_it_states(doc, command, jobs, tmp_path):
    workdir = make_workdir(tmp_path / "work")
    proc = run_snakemake(workdir, *shlex.split(command)[1:], env=USER_ENV, examples=False)
    assert proc.stdout.startswith("digraph"), proc.stdout[:2000]
    assert len(re.findall(r"^\s*\d+\[label = ", proc.stdout, re.M)) == jobs, (doc, command)


def hpcllm_status(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "hpcllm"), "status", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=hang_guard(5),  # ~2 s on a quiet machine (squeue is asked, and may fail)
    )


def test_the_documented_status_command_shows_the_800m_campaign(tmp_path):
    """docs/training.md's `hpcllm status -d <workdir> ...`, run from another folder (its
    relative config paths then read in the -d directory): the experiment, never started;
    before, the experiment file without its data config ended in a ValueError traceback."""
    workdir = make_workdir(tmp_path / "work")
    command = documented("docs/training.md", r"^hpcllm status -d <workdir> (.*)$")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = hpcllm_status("-d", str(workdir), *shlex.split(command), cwd=elsewhere)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "  opengptx_800m: 0/10 segments, checkpoint iteration -/30000" in proc.stdout
    assert "  fineweb_bpe/fineweb: 0/64 shards tokenized" in proc.stdout


def test_an_experiment_without_its_data_config_names_the_config_that_defines_it(tmp_path):
    """config/experiments/opengptx_800m.yaml alone: its tokenizer is defined by the data
    config. The plan and `hpcllm status` name the key, the file that defines it and the
    --configfile list; status in one line, without a traceback."""
    workdir = make_workdir(tmp_path / "work")
    experiment = [
        "--profile",
        "profiles/juwels",
        "--configfile",
        "config/experiments/opengptx_800m.yaml",
    ]
    want = (
        "training.experiments.opengptx_800m.data.tokenizer: 'fineweb_bpe' is not in "
        "text.tokenizers (none defined); config/examples/fineweb_juwels.yaml defines it: "
        "give the data config with the experiment's file in one --configfile list, data "
        "first (--configfile config/examples/fineweb_juwels.yaml "
        "config/experiments/opengptx_800m.yaml)"
    )
    proc = hpcllm_status("-d", str(workdir), *experiment, cwd=workdir)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == f"hpcllm status: {want}\n"
    proc = run_snakemake(workdir, "-n", *experiment, env=USER_ENV, examples=False, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and want in out, out[-3000:]


# The report-marked outputs of profiles/local's plan (the laptop examples); each must
# exist for a report.
LOCAL_REPORT_FILES = [
    "results/index.html",
    "results/train/tiny_local/loss.png",
    "results/bench/summary.csv",
    "results/bench/summary.txt",
    *(
        f"results/bench/plots/{n}.png"
        for n in ("efficiency", "throughput", "batch_time_cdf", "loss")
    ),
]


def report_landing_page(workdir, args: list[str]) -> str:
    """The report's landing page (its workflow description, rendered from
    workflow/report/workflow.rst), after Snakemake made the report without a complaint."""
    proc = run_snakemake(workdir, *args, examples=False, timeout=hang_guard(5))
    out = proc.stdout + proc.stderr
    assert "Report created." in out and "ERROR" not in out, out[-3000:]
    html = (workdir / "report.html").read_text()
    page = json.loads(re.search(r"var workflow_desc = (\".*?\");\n", html).group(1))
    assert "system-message" not in page, page  # docutils' own error, in the page itself
    return page


def test_the_documented_report_links_the_results_page_first(tmp_path):
    """The README's `snakemake ... --report report.html` after `make run`: its landing page
    links the results page. The run's report-marked files are stand-ins here (a report only
    reads them). Before, the README's command had no profile: a report of the empty
    config/config.yaml, whose landing page showed docutils' `Unknown target name:
    "index.html"`."""
    workdir = make_workdir(tmp_path / "work")
    for name in LOCAL_REPORT_FILES:
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text("a stand-in of the run's file\n")
    command = documented("README.md", r"`(snakemake [^`]*--report report\.html)`")
    page = report_landing_page(workdir, shlex.split(command)[1:])
    assert "Start with the results page" in page
    assert "javascript:app.showResultInfo('results/index.html')" in page


def test_a_report_without_a_results_page_says_how_to_make_one(tmp_path):
    """`snakemake --report report.html` over a config that plans nothing (a fresh clone's
    config/config.yaml): the landing page says how to make the report with the results
    page, instead of docutils' error on its link."""
    page = report_landing_page(make_workdir(tmp_path / "work"), ["--report", "report.html"])
    assert "No results page in this report" in page
    assert "snakemake --profile profiles/local --report report.html" in page.replace(
        '<span class="pre">', ""
    ).replace("</span>", "")


def test_a_users_fineweb_config_plans_the_users_data_only(tmp_path):
    """The example of docs/first-project.md: its FineWeb source is fetched from the hub
    (no example mirror, no example document limit), and no example source, tokenizer or
    experiment is planned beside it."""
    workdir = make_workdir(tmp_path / "work")
    args = ["-n", "--profile", "profiles/juwels"]
    args += ["--configfile", "config/examples/fineweb_juwels.yaml"]
    proc = run_snakemake(workdir, *args, env=USER_ENV, examples=False)
    out = proc.stdout + proc.stderr
    assert "rule fetch_text:" in out and "data/hub/fineweb/fetched.json" in out
    for example in ("sample_en", "sample_multilingual", "sample_bpe", "tiny_local", "hub_mirror"):
        assert example not in out, example
    outputs = set(re.findall(r"data/tokenized/[\w/.-]+_text_document\.bin", out))
    assert outputs and all(p.startswith("data/tokenized/fineweb_bpe/fineweb") for p in outputs)
    # A tokenize batch holds a node's 48 cores (12 shards x 4 threads) and 1 GB a thread:
    # the dry run shows the memory as submitted, and says that its threads are capped at
    # -n's --cores (1), the submitted job's are not.
    batches = re.findall(r"rule tokenize_batch:\n(?:.*\n)*?\s+resources: (.*)", out)
    memory = [int(re.search(r"\bmem_mb=(\d+),", r)[1]) for r in batches]
    assert sorted(memory) == [16000] + [48000] * 5, batches  # 64 shards: 5 x 12 + 4
    assert (
        "tokenize_batch: jobs are submitted with 48 threads (--cpus-per-task) and 48000 MB; "
        "this dry run shows threads: 1, Snakemake's cap for -n without --cores "
        "(-n --cores 48 shows them as submitted)." in out
    ), out[-3000:]


def test_null_in_a_configfile_unsets_the_key_it_names(tmp_path):
    """`mirror: null` over the examples' FineWeb (which reads a shipped mirror): the source
    is fetched from the hub instead; before, the null was refused ("None is not of type
    'string'")."""
    workdir = make_workdir(tmp_path / "work")
    (workdir / "mine.yaml").write_text(
        yaml.safe_dump({"text": {"sources": {"fineweb": {"mirror": None}}}})
    )
    proc = run_snakemake(workdir, "-n", "--configfile", "mine.yaml")
    out = proc.stdout + proc.stderr
    assert "Unset by null in a config file: text.sources.fineweb.mirror" in out
    assert "data/hub/fineweb/fetched.json" in out


def users_project(tmp_path):
    """The snakedeploy layout with a local path: the user's config/config.yaml (a local
    source, a tokenizer) and workflow/Snakefile, and the user's corpus."""
    project = tmp_path / "project"
    (project / "workflow").mkdir(parents=True)
    (project / "config").mkdir()
    (project / "workflow" / "Snakefile").write_text(
        'configfile: "config/config.yaml"\n\n\n'
        f'module hpcllm:\n    snakefile:\n        "{REPO / "Snakefile"}"\n'
        "    config:\n        config\n\n\nuse rule * from hpcllm\n"
    )
    config = {
        "text": {
            "sources": {"mine": {"type": "local", "files": "corpus.jsonl", "shards": 2}},
            "tokenizers": {"bpe": {"type": "train", "vocab_size": 300, "sample_documents": 200}},
            "tokenize": {"tokenizers": ["bpe"]},
        }
    }
    (project / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    words = "the weather over the hills changes with the seasons and the wind".split()
    with open(project / "corpus.jsonl", "w") as f:
        for i in range(300):
            f.write(json.dumps({"text": " ".join(words[i % 5 :] + words[: i % 5])}) + "\n")
    return project


def snakemake_in(project, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [snakemake_bin(), *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PATH": str(REPO / ".venv" / "bin") + ":/usr/bin:/bin", "HOME": str(project.parent)},
    )


def test_the_workflow_runs_as_a_module_of_a_users_project_folder(tmp_path):
    """The user's project folder: the data and results in the user's folder, nothing of
    the examples planned."""
    project = users_project(tmp_path)
    proc = snakemake_in(project, "--cores", "2", timeout=hang_guard(30))  # ~20 s quiet
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "5 of 5 steps (100%) done" in out and "sample_en" not in out
    merged = project / "data/tokenized/bpe/mine_text_document.idx"
    assert merged.is_file() and not (REPO / "data/tokenized/bpe").exists()


def test_the_module_layout_plans_with_the_local_profile(tmp_path):
    """docs/first-project.md's local command in the user's project folder plans the user's
    config. The local profile alone (its config file the laptop examples, whose data are
    in the checkout) stops saying so and what to run; before, Snakemake's raw
    `FileNotFoundError: ... 'config/examples/local.yaml'` (a path of the checkout, read in
    the user's folder)."""
    project = users_project(tmp_path)
    command = documented(
        "docs/first-project.md", r"`(snakemake --profile /path/to/hpcllm/profiles/local [^`]*)`"
    )
    args = shlex.split(command.replace("/path/to/hpcllm", str(REPO)))[1:]
    proc = snakemake_in(project, *args, timeout=hang_guard(5))  # ~2 s quiet
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "data/tokenized/bpe/mine_text_document.bin" in out and "sample_en" not in out
    proc = snakemake_in(
        project, "--profile", str(REPO / "profiles/local"), "-n", timeout=hang_guard(5)
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out[-4000:]
    assert "'resources/sample_text/en.jsonl.zst' matches no file" in out
    assert "It is the laptop examples' sample data" in out
    assert f"snakemake --profile {REPO / 'profiles/local'} --configfile config/config.yaml" in out


def test_the_documented_pictures_of_the_plan_can_be_read():
    """Issue 40 item 13: the README's `--dag | dot` of the JUWELS plan drew one box per job
    (53 jobs with the sweep and the evaluation: over 4,600 pt wide, labels unreadable). Every
    documented picture of the jobs folds them (`hpcllm dag`), and beside it the docs show
    `--rulegraph`, one box per rule."""
    pictures = [
        (doc.name, line)
        for doc in [*DOCS, REPO / "Makefile"]
        for line in doc.read_text().splitlines()
        if re.search(r"--(dag|rulegraph)\b.*\|\s*dot\b", line)
    ]
    dags = [(doc, line) for doc, line in pictures if "--dag" in line]
    assert dags and all(re.search(r"\|\s*\S*hpcllm dag\s*\|", line) for _, line in dags), dags
    with_dag = {doc for doc, _ in dags}
    assert with_dag == {doc for doc, line in pictures if "--rulegraph" in line}, pictures


# README: "... `config/experiments/language_sweep.yaml` added, the plan's 53 jobs are
# 4,672 pt wide ... (`hpcllm dag`) ..., 1,053 pt wide"
WIDTHS = re.compile(
    r"with `(config/\S+\.yaml)` and\s+`(config/\S+\.yaml)` added, the plan's (\d+) jobs are "
    r"([\d,]+) pt wide.*?`hpcllm dag` draws.*?, ([\d,]+) pt wide",
    re.S,
)


def _svg_width(dot_source: str) -> int:
    svg = subprocess.run(
        ["dot", "-Tsvg"], input=dot_source, capture_output=True, text=True, check=True,
        timeout=hang_guard(30),
    ).stdout  # fmt: skip
    return int(re.search(r'<svg width="(\d+)pt"', svg)[1])


def test_the_readmes_picture_widths_are_the_measured_ones(tmp_path):
    """Issue 51 item 4: the README's widths of the plan's pictures (Snakemake's --dag, and
    folded by `hpcllm dag`) were measured once and went stale (4,672 and 1,053 pt, then
    5,146 and 786): they are measured here, with Graphviz's dot as the README runs it
    (dot 2.43.0 here)."""
    import shutil

    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed (make dag names its package)")
    text = (REPO / "README.md").read_text()
    m = WIDTHS.search(text)
    assert m, "README's sentence on the --dag picture's widths changed: update WIDTHS"
    extra, jobs, wide, folded = m.group(1, 2), int(m.group(3)), m.group(4), m.group(5)
    (command,) = [c for _, c, _ in documented_dry_runs(DRAWN) if "opengptx_800m" in c and "-F" in c]
    args = shlex.split(command)[1:]
    at = args.index("config/experiments/opengptx_800m.yaml") + 1
    args[at:at] = extra
    workdir = make_workdir(tmp_path / "work")
    dag = run_snakemake(workdir, *args, env=USER_ENV, examples=False).stdout
    assert len(re.findall(r"^\s*\d+\[label = ", dag, re.M)) == jobs
    hpcllm = os.path.join(os.path.dirname(sys.executable), "hpcllm")
    folded_dag = subprocess.run(
        [hpcllm, "dag"], input=dag, capture_output=True, text=True, check=True,
        timeout=hang_guard(30),
    ).stdout  # fmt: skip
    measured = (_svg_width(dag), _svg_width(folded_dag))
    stated = (int(wide.replace(",", "")), int(folded.replace(",", "")))
    # within 2 %: another Graphviz version may place a box a little differently
    assert all(abs(a - b) <= 0.02 * b for a, b in zip(stated, measured, strict=True)), (
        f"README says {wide} and {folded} pt, measured {measured[0]:,} and {measured[1]:,}"
    )


def _snakemake_dag(labels: list[str], edges: list[tuple[int, int]]) -> str:
    """A DAG in the form of Snakemake's --dag output."""
    lines = ["digraph snakemake_dag {", "    graph[bgcolor=white, margin=0];"]
    lines += [f'\t{i}[label = "{label}", color = "0.1 0.6 0.85", style="rounded"];'
              for i, label in enumerate(labels)]  # fmt: skip
    return "\n".join([*lines, *(f"\t{a} -> {b}" for a, b in edges), "}"]) + "\n"


def test_hpcllm_dag_draws_a_rules_like_jobs_as_one_box(monkeypatch, capsys):
    """A sweep's points (the larger wait for the smaller ones), a chain of segments and the
    tokenize batches each become one box with their number and wildcards in short; the
    edges between boxes stay, those within a box are a loop on it."""
    import io

    from hpcllm import cli
    from hpcllm.dag import fold

    points = [f"language.m.{s}.bf16.n{n:04d}" for n in (1, 2, 4, 8) for s in ("strong", "weak")]
    labels = ["all", "aggregate_benchmarks", "canary\\nkind: language", "fetch_text",
              "merge_tokenized", *(f"tokenize_batch\\nbatch: {b:04d}" for b in range(3)),
              *(f"bench_language\\npoint: {p}" for p in points),
              *(f"train_segment\\nk: {k}" for k in range(1, 11))]  # fmt: skip
    index = {label.split("\\n")[-1].split(": ")[-1]: i for i, label in enumerate(labels)}
    bench, seg = [index[p] for p in points], [index[str(k)] for k in range(1, 11)]
    edges = [
        (1, 0),
        (4, 0),
        (seg[-1], 0),
        *((3, b) for b in (5, 6, 7)),
        *((b, 4) for b in (5, 6, 7)),
    ]
    edges += [e for b in bench for e in ((2, b), (b, 1))]
    edges += [(bench[i], bench[i + 2]) for i in range(len(bench) - 2)]  # holds
    edges += [(4, s) for s in seg] + list(zip(seg, seg[1:]))
    dot = _snakemake_dag(labels, edges)
    folded = fold(dot)
    boxes = re.findall(r'^\t(\d+)\[label = "([^"]*)"', folded, re.M)
    assert len(boxes) == 8, boxes
    shown = {label.split("\\n")[0]: label.split("\\n")[1:] for _, label in boxes}
    assert shown["bench_language"] == ["8 jobs", "point: language.m.{strong,weak}.bf16.n0001…n0008"]
    assert shown["train_segment"] == ["10 jobs", "k: 1…10"]
    assert shown["tokenize_batch"] == ["3 jobs", "batch: {0000,0001,0002}"]
    box = {label.split("\\n")[0]: n for n, label in boxes}
    links = set(re.findall(r"^\t(\d+) -> (\d+)$", folded, re.M))
    b, s, t = box["bench_language"], box["train_segment"], box["tokenize_batch"]
    assert {(b, b), (s, s), (box["canary"], b), (b, box["aggregate_benchmarks"])} <= links
    assert (t, t) not in links and {(box["fetch_text"], t), (t, box["merge_tokenized"])} <= links
    assert (s, box["all"]) in links and len(links) == 10, links
    # the command the docs pipe it through
    monkeypatch.setattr("sys.stdin", io.StringIO(dot))
    assert cli.main(["dag"]) == 0 and capsys.readouterr().out == folded
