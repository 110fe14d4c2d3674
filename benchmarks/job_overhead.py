"""The fixed cost of one job, before its work: where a tokenize job's CPU goes.

A job on Slurm is ``python -m snakemake --target-jobs ... --mode remote``: it parses the
Snakefile again (the config validated, every stage's rules and plan-time code), then runs
the rule's script in a fresh Python (its imports, the tokenizer load). This builds a
working folder with one local source of one tiny shard and a tiny tokenizer, then, in
rounds (every command once per round, so that ratios compare runs under the same load),
measures the CPU time (user + system, the process and its children) of:

- ``python -c pass``: the interpreter's own start;
- the bare job: the same job command on a bare Snakefile with a rule ``tokenize`` of the
  same outputs whose shell touches them (Snakemake's own job start);
- the bare job with ``script:`` instead of ``shell:`` (a script that touches the outputs):
  what Snakemake's ``script:`` itself costs a job;
- the workflow's job process without its command (the same command with ``-n``): Snakemake
  plus parsing this workflow's Snakefile in a job;
- the workflow's tokenize job as a whole (``python -m hpcllm.text.tokenize_job`` from
  ``shell:`` since issue 51 item 11, a ``script:`` before; on a one-document shard);
- each job's imports alone (tokenize, merge_tokenized, pack_lmdb), in a fresh Python.

Python writes the bytecode of the modules it compiles (``__pycache__``), as it does on a
cluster by default: each command runs once before the rounds, and ``PYTHONDONTWRITEBYTECODE``
is removed from the commands' environment. Snakemake and the other installed packages
come with their bytecode; without it (``--no-bytecode`` keeps the variable as set) every job
compiles the workflow's package from source, about 0.16 CPU-s of a tokenize job here
(the package's ``__pycache__`` folders are then removed first: Python would read them).

Prints medians, the ratio of the whole job to the bare one, and the load average. With
``--compare REF`` (a git revision), the job process of that revision's workflow (its
files exported beside the case) and its whole tokenize job run in the same rounds, for
before/after ratios measured under the same load.

Usage: python benchmarks/job_overhead.py [--repeat 5] [--workdir DIR] [--compare REF]
       [--no-bytecode]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

BARE = """
rule tokenize:
    input:
        source="in.jsonl",
        tokenizer="tokenizers/{tok}/tokenizer.json",
    output:
        multiext("data/tokenized/{tok}/{source}/{shard}_text_document", ".bin", ".idx", ".manifest.json"),
    log:
        "logs/tokenize/{tok}/{source}/{shard}.log",
    benchmark:
        "results/timings/tokenize/{tok}/{source}/{shard}.tsv"
    threads: 4
    shell:
        "touch {output}"
"""

BARE_SCRIPT = BARE.replace(
    'shell:\n        "touch {output}"', 'script:\n        "touch_outputs.py"'
)
TOUCH_OUTPUTS = (
    "from pathlib import Path\n\nfor path in snakemake.output:\n    Path(path).touch()\n"
)

# Each job script's imports, as the script makes them (the scripts' folder is on the
# path after site-packages, as Snakemake puts it: workflow/scripts/tokenize.py must not
# shadow the standard library's tokenize).
IMPORTS = {
    "tokenize": "import argparse, json\nfrom hpcllm.offline import go_offline\n"
    "from hpcllm import logs\n"
    "from hpcllm.text.shards import source_policy, tokenize_source_shard\n"
    "from hpcllm.text.tokenizers_config import tokenizer_for",
    "merge_tokenized": "from hpcllm.offline import go_offline\nfrom hpcllm import logs\n"
    "from hpcllm.text.indexed_dataset import merge_datasets\n"
    "from hpcllm.text.shard_pool import check_batch_outputs\n"
    "from hpcllm.text.shards import check_source_size",
    "pack_lmdb": "import argparse, ast, json\nfrom hpcllm.offline import go_offline\n"
    "from hpcllm import logs\n"
    "from hpcllm.vision.datasets_config import pack_dataset_split",
}
SCRIPT_PATH = (
    f"import sys; sys.path.append({str(REPO / 'workflow' / 'scripts')!r})\nimport hpcllm_checkout\n"
)
TARGET = "tokenize:tok=tok,source=web,shard=0000"


def make_case(work: Path) -> Path:
    if (work / "Snakefile.bare").exists():
        if not (work / "Snakefile.script").exists():  # a case made by an older version
            (work / "Snakefile.script").write_text(BARE_SCRIPT)
            (work / "touch_outputs.py").write_text(TOUCH_OUTPUTS)
        return work
    work.mkdir(parents=True, exist_ok=True)
    for name in ("resources", "profiles"):
        (work / name).symlink_to(REPO / name)
    (work / "config").mkdir()
    for item in (REPO / "config").iterdir():
        if item.name != "config.yaml":
            (work / "config" / item.name).symlink_to(item)
    import yaml
    from tokenizers import Tokenizer, models

    tiny = Tokenizer(models.WordLevel({"<|endoftext|>": 0, "a": 1}, unk_token="a"))
    tiny.add_special_tokens(["<|endoftext|>"])
    (work / "tokenizers" / "tok").mkdir(parents=True)
    tiny.save(str(work / "tokenizers" / "tok" / "tokenizer.json"))
    (work / "in.jsonl").write_text('{"text": "a document"}\n')
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["text"] = {
        "sources": {"web": {"type": "local", "files": "in.jsonl", "shards": 1}},
        "tokenizers": {"tok": {"type": "files", "tokenizer_json": "tokenizers/tok/tokenizer.json"}},
        "tokenize": {"tokenizers": ["tok"]},
    }
    (work / "config" / "config.yaml").write_text(json.dumps(config))
    (work / "Snakefile.bare").write_text(BARE)
    (work / "Snakefile.script").write_text(BARE_SCRIPT)
    (work / "touch_outputs.py").write_text(TOUCH_OUTPUTS)
    return work


def job_command(snakefile: str, dry: bool) -> list[str]:
    """What Snakemake's executors run for one job (their general arguments)."""
    return [
        sys.executable, "-m", "snakemake", "--snakefile", snakefile,
        "--target-jobs", TARGET, "--allowed-rules", "tokenize", "--cores", "4",
        "--attempt", "1", "--force-use-threads", "--force", "--nolock", "--no-hooks",
        "--target-files-omit-workdir-adjustment", "--max-inventory-time", "0",
        "--ignore-incomplete", "--quiet", "all", "--mode", "remote", *(["-n"] if dry else []),
    ]  # fmt: skip


# CPU of one command and its children, from a parent that runs nothing else.
MEASURE = """
import resource, subprocess, sys, json
p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": p.returncode, "cpu": u.ru_utime + u.ru_stime, "err": p.stderr[-3000:]}))
"""


def drop_bytecode(*folders: Path) -> None:
    """Remove the ``__pycache__`` folders under ``folders``: Python reads bytecode that is
    there even where PYTHONDONTWRITEBYTECODE stops it writing any."""
    for folder in folders:
        for cache in list(Path(folder).rglob("__pycache__")):
            shutil.rmtree(cache, ignore_errors=True)


def cpu(cmd: list[str], cwd: Path, bytecode: bool = True) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, *cmd], cwd=cwd, env=env, capture_output=True, text=True
    )
    result = json.loads(out.stdout)
    if result["rc"] != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{result['err']}")
    return result["cpu"]


def export_revision(ref: str, work: Path) -> Path:
    """The workflow's files at git revision ``ref``, in a folder of the case (its
    Snakefile puts its own src first on the path, so its package is the one imported)."""
    folder = work / f"rev-{ref.replace('/', '_')}"
    if not folder.exists():
        folder.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


COMPARED = "the same, workflow at {ref} (-n)"
COMPARED_WHOLE = "tokenize job at {ref}, whole"


def commands(compare: Path | None = None, ref: str = "") -> dict[str, list[str]]:
    snakefile = str(REPO / "Snakefile")
    cmds = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "bare Snakemake job (shell: touch)": job_command("Snakefile.bare", dry=False),
        "bare job, script: touching the outputs": job_command("Snakefile.script", dry=False),
        "workflow job process, no script (-n)": job_command(snakefile, dry=True),
    }
    if compare is not None:  # right after its counterpart, for the rounds' pairs
        cmds[COMPARED.format(ref=ref)] = job_command(str(compare / "Snakefile"), dry=True)
    cmds["workflow tokenize job, whole"] = job_command(snakefile, dry=False)
    if compare is not None:
        cmds[COMPARED_WHOLE.format(ref=ref)] = job_command(str(compare / "Snakefile"), dry=False)
    for name, code in IMPORTS.items():
        cmds[f"{name} job's imports"] = [sys.executable, "-c", SCRIPT_PATH + code]
    return cmds


def run(work: Path, repeat: int, ref: str | None = None, bytecode: bool = True) -> dict[str, float]:
    make_case(work)
    cmds = commands(export_revision(ref, work), ref) if ref else commands()
    print(
        "bytecode: written and reused (Python's default)"
        if bytecode
        else f"bytecode: PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}"
    )
    if bytecode:  # the first run of each writes it
        for cmd in cmds.values():
            cpu(cmd, work, bytecode)
    else:
        drop_bytecode(REPO / "src", REPO / "workflow", *work.glob("rev-*"))
    runs: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(repeat):  # interleaved, so load changes hit all alike
        for name, cmd in cmds.items():
            runs[name].append(cpu(cmd, work, bytecode))
    medians = {name: statistics.median(r) for name, r in runs.items()}
    for name, value in medians.items():
        spread = ", ".join(f"{x:.2f}" for x in runs[name])
        print(f"{name:42} {value:6.2f} s CPU  (runs {spread})")
    bare = medians["bare Snakemake job (shell: touch)"]
    whole = medians["workflow tokenize job, whole"]
    parse = medians["workflow job process, no script (-n)"]
    print(f"Snakefile parse and checks in a job, over bare Snakemake: {parse - bare:.2f} s CPU")
    print(f"command (its Python, imports, tokenizer, one document): {whole - parse:.2f} s CPU")
    print(f"ratio workflow tokenize job / bare Snakemake job: {whole / bare:.2f}")
    script = medians["bare job, script: touching the outputs"]
    print(f"Snakemake's script: itself, over shell: {script - bare:.2f} s CPU")
    if ref:
        before = medians[COMPARED.format(ref=ref)]
        # The ratio of each round's pair, then their median: the pair ran back to back.
        paired = statistics.median(
            a / b
            for a, b in zip(
                runs["workflow job process, no script (-n)"], runs[COMPARED.format(ref=ref)]
            )
        )
        print(
            f"job process (-n) over bare Snakemake: {parse - bare:.2f} s CPU here, "
            f"{before - bare:.2f} s at {ref}; job process here / at {ref}: "
            f"{parse / before:.2f} (medians), {paired:.2f} (median of the rounds' ratios)"
        )
        whole_before = medians[COMPARED_WHOLE.format(ref=ref)]
        print(
            f"ratio tokenize job at {ref} / bare Snakemake job: {whole_before / bare:.2f}; "
            f"whole job here / at {ref}: {whole / whole_before:.2f} (medians)"
        )
    print(f"load: {os.getloadavg()[0]:.1f} (1 min)")
    return medians


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="rounds (medians)")
    ap.add_argument("--workdir", type=Path, help="working folder (default: a temporary one)")
    ap.add_argument(
        "--compare", metavar="REF", help="also time the job process of git revision REF"
    )
    ap.add_argument(
        "--no-bytecode",
        action="store_true",
        help="keep PYTHONDONTWRITEBYTECODE as the environment sets it",
    )
    args = ap.parse_args(argv)
    print(f"load: {os.getloadavg()[0]:.1f} (1 min)")
    bytecode = not args.no_bytecode
    if args.workdir:
        return run(args.workdir, args.repeat, args.compare, bytecode)
    with tempfile.TemporaryDirectory() as d:
        return run(Path(d) / "case", args.repeat, args.compare, bytecode)


if __name__ == "__main__":
    main()
