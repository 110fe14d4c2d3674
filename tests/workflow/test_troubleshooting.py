"""docs/troubleshooting.md: every command it shows makes the mistake it describes, and
Snakemake (or the workflow) prints the lines the page quotes (issue 51, item 3)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess

import pytest
from support import REPO, hang_guard, make_workdir, snakemake_bin

from hpcllm.commandline import requested_targets, unknown_experiment_targets

PAGE = REPO / "docs/troubleshooting.md"
# A section's command block and the block of what it prints, right after it.
ENTRY = re.compile(r"^## (.+?)\n.*?```bash\n(.*?)```\n```text\n(.*?)```", re.M | re.S)


def entries() -> list[tuple[str, str, list[str]]]:
    return [
        (title, commands, printed.splitlines())
        for title, commands, printed in ENTRY.findall(PAGE.read_text())
    ]


def test_the_page_covers_the_traps_and_the_readme_links_it():
    titles = [title for title, _, _ in entries()]
    assert len(titles) == 5, titles
    assert "(docs/troubleshooting.md)" in (REPO / "README.md").read_text()


@pytest.mark.workflow
@pytest.mark.parametrize("title,commands,printed", entries(), ids=lambda v: str(v)[:40])
def test_a_documented_mistake_prints_what_the_page_says(title, commands, printed, tmp_path):
    workdir = make_workdir(tmp_path / "work")
    # `snakemake` as a user runs it in the checkout: the workflow's Snakefile found there
    script = f'snakemake() {{ {shlex.quote(snakemake_bin())} -s {REPO / "Snakefile"} "$@"; }}\n'
    env = {**os.environ, "HPCLLM_ACCOUNT": "myproject", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        ["bash", "-c", script + commands],
        cwd=workdir,
        capture_output=True,
        text=True,
        env=env,
        timeout=hang_guard(60),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    for line in printed:
        assert line in out, f"{title}: the page quotes {line!r}; Snakemake printed:\n{out[-3000:]}"


def test_targets_naming_unknown_experiments_list_the_known_ones():
    known, rules = ["opengptx_800m", "tiny_local"], ["all", "train_segment"]
    message = unknown_experiment_targets(
        ["results/train/opengptx_80m/seg1.json", "checkpoints/nothing_like_it/iter_0000010",
         "results/layout/tiny_locl.json", "results/train/tiny_local/seg2.json",
         "data/tokenized/bpe/fineweb_text_document.bin", "all"],
        known, rules,
    )  # fmt: skip
    lines = message.splitlines()
    assert len(lines) == 3, lines
    assert lines[0] == (
        "target results/train/opengptx_80m/seg1.json: no experiment 'opengptx_80m' in the "
        "config (did you mean 'opengptx_800m'?); the config defines opengptx_800m, tiny_local"
    )
    assert "no experiment 'nothing_like_it' in the config; the config defines" in lines[1]
    assert "no experiment 'tiny_locl'" in lines[2] and "'tiny_local'?" in lines[2]
    # a bare word: an experiment's name, or close to one; another word is Snakemake's
    assert "is not a target; its files are" in unknown_experiment_targets(
        ["tiny_local"], known, rules
    )
    assert "did you mean 'tiny_local'" in unknown_experiment_targets(["tiny_locl"], known, rules)
    assert unknown_experiment_targets(["clean", "all"], known, rules) is None
    assert "training.experiments is empty" in unknown_experiment_targets(
        ["results/train/x/seg1.json"], [], rules
    )


def test_the_targets_are_read_as_snakemake_reads_its_command_line():
    argv = ["/venv/bin/snakemake", "--profile", "p", "-n", "results/a.json", "--configfile",
            "a.yaml", "b.json"]  # fmt: skip
    assert requested_targets(argv) == ["results/a.json"]  # b.json: a config file
    assert requested_targets(["/venv/bin/snakemake", "--configfile", "a.yaml", "--", "t"]) == ["t"]
    assert requested_targets(["/usr/bin/pytest", "results/a.json"]) == []
