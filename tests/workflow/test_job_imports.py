"""Every job pays its script's imports: the scripts of the many small jobs (a tokenize job
per shard, a merge per source, a pack per image split) import nothing they do not use."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest
from support import REPO

SCRIPTS = REPO / "workflow" / "scripts"
HEAVY = {"pandas", "torch", "matplotlib", "scipy", "transformers", "datasets", "pyarrow"}


def imported_by(script: str) -> set[str]:
    """The top-level packages in sys.modules after the script's own import statements
    (a package module's: also those of its main(), where a shell: rule's job makes them),
    run in a fresh Python with the scripts' folder after site-packages (as Snakemake puts
    it)."""
    path = REPO / "src" / script if script.startswith("hpcllm/") else SCRIPTS / script
    tree = ast.parse(path.read_text())
    mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    body = tree.body + [s for m in mains for s in m.body]
    imports = [
        ast.unparse(n)
        for n in body
        if isinstance(n, (ast.Import, ast.ImportFrom))
        and getattr(n, "module", None) != "__future__"
    ]
    code = "\n".join(
        [
            f"import sys; sys.path.append({str(SCRIPTS)!r})",
            *imports,
            "import json; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))",
        ]
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(json.loads(proc.stdout))


@pytest.mark.parametrize(
    "script, also_unused",
    [
        # yaml: hpcllm.text.hub_files reads a dataset card only on the login node
        ("hpcllm/text/tokenize_job.py", {"yaml"}),
        ("merge_tokenized.py", {"yaml"}),
        # pack_lmdb's job is a module now: tests/vision/test_pack_job.py
    ],
)
def test_a_job_script_imports_only_what_it_uses(script, also_unused):
    modules = imported_by(script)
    assert "hpcllm" in modules  # the imports ran
    assert not (HEAVY | also_unused) & modules


# Snakemake in this process, with check_section and the schema loads counted (the
# Snakefile imports hpcllm from the checkout, the module already loaded here).
COUNTED = """
import atexit, json, runpy, sys
import hpcllm.configuration as c
checked = []
original = c.check_section
def counted(section, *args, **kwargs):
    checked.append(section)
    return original(section, *args, **kwargs)
c.check_section = counted
atexit.register(lambda: print("COUNTS " + json.dumps(
    {"checked": checked, "parsed": c._load_schema.cache_info().misses}), file=sys.stderr))
sys.argv = ["snakemake", *sys.argv[1:]]
runpy.run_module("snakemake", run_name="__main__")
"""


def test_a_job_process_parses_each_schema_once_and_leaves_the_checks_to_the_controller(
    tmp_path,
):
    """Every Slurm job parses the Snakefile again (issue 33 item 11): its config is the
    controller's, already checked by key, so a job skips check_section, and each schema
    file is parsed once per process (it was 13 pure-Python parses of 6 files)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from job_overhead import job_command, make_case
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    work = make_case(tmp_path / "case")
    schemas = len(list((REPO / "workflow" / "schemas").glob("*.schema.yaml")))

    def counts(cmd):
        proc = subprocess.run(
            [sys.executable, "-c", COUNTED, *cmd[3:]],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = [x for x in proc.stderr.splitlines() if x.startswith("COUNTS ")][-1]
        return json.loads(line.removeprefix("COUNTS "))

    job = counts(job_command(str(REPO / "Snakefile"), dry=True))
    assert job["checked"] == []
    assert 0 < job["parsed"] <= schemas
    plan = counts([*job_command(str(REPO / "Snakefile"), dry=True)[:5], "-n", "--cores", "1"])
    assert plan["checked"] == ["", "text", "vision", "containers", "training", "benchmarks"]
    assert 0 < plan["parsed"] <= schemas
