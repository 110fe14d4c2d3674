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
    """The top-level packages in sys.modules after the script's own import statements,
    run in a fresh Python with the scripts' folder after site-packages (as Snakemake puts
    it)."""
    tree = ast.parse((SCRIPTS / script).read_text())
    imports = [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
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
        ("tokenize.py", set()),
        ("merge_tokenized.py", set()),
        # numpy only generates the sample images (hpcllm.vision.sample_data), no pack;
        # subprocess came with ctypes.util, which ran ldconfig to find the C library
        ("pack_lmdb.py", {"numpy", "subprocess"}),
    ],
)
def test_a_job_script_imports_only_what_it_uses(script, also_unused):
    modules = imported_by(script)
    assert "hpcllm" in modules  # the imports ran
    assert not (HEAVY | also_unused) & modules
