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
