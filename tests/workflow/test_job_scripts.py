"""Job scripts import hpcllm from the checkout that planned the run, not an installed copy."""

from __future__ import annotations

import ast
import subprocess
import sys

from support import REPO

SCRIPTS = REPO / "workflow" / "scripts"


def test_every_job_script_imports_the_checkout_before_hpcllm():
    for path in sorted(SCRIPTS.glob("*.py")):
        if path.name == "hpcllm_checkout.py":
            continue
        imports = [
            (n.module if isinstance(n, ast.ImportFrom) else n.names[0].name)
            for n in ast.parse(path.read_text()).body
            if isinstance(n, ast.Import | ast.ImportFrom)
        ]
        first_hpcllm = next(i for i, m in enumerate(imports) if m.split(".")[0] == "hpcllm")
        assert "hpcllm_checkout" in imports[:first_hpcllm], path.name


def test_the_checkout_wins_over_an_installed_copy_already_imported(tmp_path):
    # An installed hpcllm ahead on sys.path and already imported (as Snakemake's preamble
    # does when it unpickles params), the scripts' folder appended last (as Snakemake does).
    fake = tmp_path / "site" / "hpcllm"
    (fake / "text").mkdir(parents=True)
    (fake / "__init__.py").write_text("INSTALLED = True\n")
    (fake / "text" / "__init__.py").write_text("")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path / 'site')!r}); import hpcllm.text; "
        f"assert hpcllm.INSTALLED; sys.path.append({str(SCRIPTS)!r}); import hpcllm_checkout; "
        "import hpcllm, hpcllm.text.shards; print(hpcllm.__file__, hpcllm.text.shards.__file__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [
        str(REPO / "src" / "hpcllm" / "__init__.py"),
        str(REPO / "src" / "hpcllm" / "text" / "shards.py"),
    ]


def rule_scripts() -> dict[str, tuple[str, bool]]:
    """rule -> (its script's file name, whether it runs on the login node), from the rule
    files themselves."""
    import re

    rules = {}
    smk_text = "\n".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk"))
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for block in re.split(r"\n(?=rule \w+:)", smk.read_text()):
            head = re.match(r"rule (\w+):", block)
            script = re.search(r'script:\s*\n\s*"\.\./scripts/([\w.]+)"', block)
            # a shell: rule running a package module: params module=NAME, where the rule
            # files define NAME = package_module("hpcllm.text.tokenize_job")
            param = re.search(r"^\s+module=(\w+),$", block, re.M)
            module = param and re.search(
                rf'^{param.group(1)} = package_module\(\s*"(hpcllm[\w.]+)"', smk_text, re.M
            )
            if head and (script or module):
                local = re.search(r"^\s+localrule: (.*)$", block, re.M)
                name = (
                    script.group(1)
                    if script
                    else str(REPO / "src" / (module.group(1).replace(".", "/") + ".py"))
                )
                rules[head.group(1)] = (name, local is not None and local.group(1))
    return rules


def calls_go_offline(path) -> bool:
    """go_offline() at the top of a script, or in a module's main()."""
    tree = ast.parse(path.read_text())
    mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    return any(
        isinstance(n, ast.Expr)
        and isinstance(n.value, ast.Call)
        and getattr(n.value.func, "id", None) == "go_offline"
        for n in tree.body + [s for m in mains for s in m.body]
    )


def test_compute_jobs_run_without_the_hub_and_login_node_rules_with_it():
    """Issue 21: every compute job sets the Hugging Face offline variables (a stray hub
    lookup fails at once instead of after network timeouts); the login-node rules, which
    download, do not. A container build (a login-node rule except where the site builds
    on compute nodes) needs the network and never the hub: left alone."""
    rules = rule_scripts()
    assert {"tokenize", "train_segment", "bench_language", "fetch_text"} <= set(rules)
    # train_segment with training.chain on Slurm (localrule: CHAINED) runs
    # train_segment_chain.py on the login node (it submits and waits; the chain's jobs go
    # offline in hpcllm.training.campaign.chain), else train_segment.py as a compute job.
    assert rules["train_segment"] == ("train_segment_chain.py", "CHAINED")
    rules["train_segment_chain"] = ("train_segment_chain.py", "True")
    rules["train_segment"] = ("train_segment.py", False)
    for rule, (script, local) in rules.items():
        offline = calls_go_offline(SCRIPTS / script)
        if rule == "build_container" or local == "True":
            assert not offline, f"{rule} ({script}) runs on the login node: no go_offline()"
        else:
            assert local is False, (rule, local)
            assert offline, f"{rule} is a compute job: {script} must call go_offline() first"
