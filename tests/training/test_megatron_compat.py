"""The one shim between the jobs' Megatron release and the workflow's Python
(hpcllm.models.megatron_compat): the release is what is installed, by every install
path, and its training modules import on this Python with the shim (and without it
only from Python 3.12)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import tomllib
import yaml
from support import REPO

from hpcllm.models.megatron_args import MEGATRON_LM_RELEASE
from hpcllm.models.megatron_compat import (
    INSTALL,
    MEGATRON_CORE,
    MEGATRON_CORE_NEEDS_PYTHON,
    check_installed,
)

OLD_PYTHON = sys.version_info < MEGATRON_CORE_NEEDS_PYTHON
PIP_311 = f"--no-deps --ignore-requires-python megatron-core=={MEGATRON_CORE}"


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, check=False, timeout=300)  # fmt: skip


def test_the_installed_megatron_core_is_the_jobs_release():
    assert MEGATRON_LM_RELEASE == f"core_v{MEGATRON_CORE}"
    assert check_installed() == MEGATRON_CORE


def test_every_install_path_installs_that_release():
    """`make` (the venv), the conda environment (envs/workflow.yaml and its post-deploy
    script, which Snakemake runs in it) and pyproject's extra on Python >= 3.12."""
    train = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["train"]
    assert f"megatron-core=={MEGATRON_CORE}; python_version >= '3.12'" in train
    assert any(d.startswith("triton") for d in train)
    assert PIP_311 in (REPO / "Makefile").read_text()
    post_deploy = REPO / "envs/workflow.post-deploy.sh"
    assert f"python -m pip install {PIP_311}" in post_deploy.read_text()
    assert os.access(post_deploy, os.X_OK)
    conda = yaml.safe_load((REPO / "envs/workflow.yaml").read_text())["dependencies"]
    assert "..[train]" in next(d for d in conda if isinstance(d, dict))["pip"]
    assert ("--ignore-requires-python" in INSTALL) == OLD_PYTHON


def test_the_training_modules_import_with_the_shim():
    done = python(
        """
        from hpcllm.models import megatron_compat
        megatron_compat.enable()
        megatron_compat.enable()  # idempotent
        import typing
        from megatron.training import arguments
        from megatron.training.models import gpt
        assert gpt.override is typing.override
        print(arguments.__file__)
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.skipif(not OLD_PYTHON, reason="typing.override is the standard library's")
def test_without_the_shim_the_training_modules_need_python_3_12():
    """The gap the shim closes: when this fails, the shim (and its install lines) can go."""
    done = python("from megatron.training import arguments")
    assert done.returncode != 0
    assert "cannot import name 'override' from 'typing'" in done.stderr


SCRIPT = """\
import multiprocessing
import sys
from typing import override  # as megatron/training/models/gpt.py and hybrid.py do


def child(queue):
    queue.put(override.__name__)


if __name__ == "__main__":
    assert sys.path[0] == {folder!r}, sys.path  # the script's folder, as `python SCRIPT`
    print("args", sys.argv[1:])
    # a spawn child imports this script again (Megatron's checkpoint writer's results
    # queue is a spawn Manager), before it could run any code of ours
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=child, args=(queue,))
    process.start()
    print("child", queue.get(timeout=120))
    process.join()
    sys.exit(process.exitcode)
"""


def test_a_script_runs_through_the_shim_in_its_own_and_its_spawned_processes(tmp_path):
    """A bare-metal job's program (python -m hpcllm.models.megatron_compat SCRIPT ARGS):
    the script runs as ``python SCRIPT ARGS`` would, and it and the processes it spawns
    import ``typing.override`` on this Python."""
    script = tmp_path / "pretrain_gpt.py"
    script.write_text(SCRIPT.format(folder=str(tmp_path)))
    done = subprocess.run(
        [sys.executable, "-m", "hpcllm.models.megatron_compat", str(script), "--lr", "1"],
        capture_output=True, text=True, check=False, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "args ['--lr', '1']" in done.stdout
    assert "child override" in done.stdout, done.stdout
    if OLD_PYTHON:  # the same script without the shim: the gap it closes
        bare = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              check=False, timeout=300)  # fmt: skip
        assert "cannot import name 'override' from 'typing'" in bare.stderr


def test_megatron_core_imports_with_triton_installed():
    """megatron.core reaches Triton kernels at import (moe/ops/paged_stash.py): the real
    Triton, which imports without a GPU."""
    done = python(
        """
        import megatron.core.transformer.moe.ops.paged_stash as ops, triton
        print(ops.GLOBAL_BLOCK_SIZE, triton.__version__)
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_skip_for_lack_of_megatron_fails_in_ci(tmp_path):
    (tmp_path / "conftest.py").write_text((REPO / "tests/conftest.py").read_text())
    (tmp_path / "support.py").write_text("REPO = None\ndef make_workdir(p): return p\n")
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "@pytest.mark.skipif(True, reason=\"could not import 'megatron.core'\")\n"
        "def test_megatron(): pass\n"
        "def test_megatron_core(): pytest.skip('Megatron Core is not installed')\n"
        "def test_other(): pytest.skip('no Graphviz')\n"
        "def test_tree(): pytest.skip('needs a Megatron-LM tree at the pin (MEGATRON_LM_DIR)')\n"
    )
    # the mark's skip fails at set-up (an error), the test's own in its call, and so does
    # a test that asks for the pin's Megatron-LM tree (CI has the shared reference copy)
    for ci, summary in (("true", "2 failed, 1 skipped, 1 error"), ("", "4 skipped")):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
             "-q", str(tmp_path)],
            capture_output=True, text=True, cwd=tmp_path, check=False,
            env={**os.environ, "CI": ci, "PYTHONPATH": str(tmp_path)},
        )  # fmt: skip
        assert summary in done.stdout, done.stdout[-2000:]
