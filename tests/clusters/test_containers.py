"""Container images: choice per cluster, a missing runtime, and the build with digest."""

from __future__ import annotations

import hashlib
import json
import platform
import stat
import sys
from pathlib import Path

import pytest
import yaml

from hpcllm.clusters import load_cluster
from hpcllm.containers import (
    HELPERS_DIR,
    HELPERS_IMPORT,
    MEGATRON_IN_IMAGE,
    ContainerRuntimeError,
    build_image,
    image_for,
    runtime_executable,
)

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "config" / "clusters"
USE = {
    "train": {"nvidia": "megatron-nvidia", "amd": "megatron-rocm"},
    "vision": {"nvidia": "vision-nvidia"},
}


def test_image_follows_the_gpu_vendor_and_runtime():
    assert image_for(load_cluster("juwels", ROOT), "train", USE) == "megatron-nvidia"
    assert image_for(load_cluster("lumi", ROOT), "train", USE) == "megatron-rocm"
    assert image_for(load_cluster("local", ROOT), "train", USE) is None
    with pytest.raises(KeyError, match="containers.use.vision names no image for amd"):
        image_for(load_cluster("lumi", ROOT), "vision", USE)


def test_definition_files_exist_and_pin_their_sources():
    for name in ("megatron-nvidia", "megatron-rocm", "vision-nvidia"):
        text = (REPO / "envs" / f"{name}.def").read_text()
        assert text.count("Bootstrap: docker") == 1 and "requirements.txt" in text
    for name in ("megatron-nvidia", "megatron-rocm"):
        text = (REPO / "envs" / f"{name}.def").read_text()
        commit = text.split("MEGATRON_COMMIT=")[1].split()[0]
        assert len(commit) == 40 and int(commit, 16) and "git checkout --detach" in text


def test_every_megatron_image_builds_its_dataset_helpers_and_checks_them():
    """Rank 0 of every Megatron job runs `make` in megatron/core/datasets at start-up
    (initialize_megatron's _compile_dependencies; the start-up itself is run in
    tests/training/test_megatron_conformance.py): each image builds the helpers, with
    pybind11, and imports them. Read from the recipes, as Apptainer cannot run here; the
    cotainr image builds them in its checkout (test_site_containers_offline.py)."""
    helpers = f"{MEGATRON_IN_IMAGE}/{HELPERS_DIR}"
    for name in ("megatron-nvidia", "megatron-rocm"):
        text = (REPO / "envs" / f"{name}.def").read_text()
        post, test = text.split("%post")[1].split("\n%")[0], text.split("%test")[1]
        lines = [line.strip() for line in post.splitlines()]

        def at(found, lines=lines, name=name):
            hits = [i for i, line in enumerate(lines) if found(line)]
            assert hits, f"{name}.def: %post lacks a step"
            return hits[0]

        steps = [
            at(lambda x: x.startswith("pip install") and "pybind11" in x),
            at(lambda x: x.startswith("pip install") and x.endswith(f"-e {MEGATRON_IN_IMAGE}")),
            at(lambda x: x == f"make -C {helpers}"),
            at(lambda x: x == f"make -q -C {helpers}"),  # what the job's make finds: done
            at(lambda x: x.startswith("python -c") and HELPERS_IMPORT in x),
        ]
        assert steps == sorted(steps), f"{name}.def: the helper steps are out of order"
        assert "compile_helpers(); from megatron.core.datasets import helpers_cpp" in test
    env = yaml.safe_load((REPO / "envs" / "megatron-rocm.cotainr.yml").read_text())
    assert {"make", "gxx", "pybind11"} <= {d for d in env["dependencies"] if isinstance(d, str)}


def test_a_missing_runtime_says_what_to_do():
    with pytest.raises(ContainerRuntimeError, match="'apptainer' is not on the PATH.*none"):
        runtime_executable(load_cluster("juwels", ROOT), which=lambda name: None)
    with pytest.raises(ContainerRuntimeError, match="'none'"):
        runtime_executable(load_cluster("local", ROOT))
    assert runtime_executable(load_cluster("lumi", ROOT), which=lambda n: f"/bin/{n}") == (
        "/bin/singularity"
    )


def fake_runtime(path: Path, fail: bool = False) -> Path:
    """An `apptainer` stand-in (none can be installed here): `build [opts] SIF DEF` writes
    SIF from DEF's bytes and the files %files names, read from the working directory."""
    path.write_text(
        f"#!{sys.executable}\n"
        "import sys, pathlib\n"
        "a = sys.argv[1:]\n"
        "if a == ['--version']: print('apptainer version 1.3.6'); sys.exit(0)\n"
        f"if {fail!r}: print('FATAL: no space left', file=sys.stderr); sys.exit(255)\n"
        "assert a[0] == 'build', a\n"
        "sif, d = pathlib.Path(a[-2]), pathlib.Path(a[-1])\n"
        "req = pathlib.Path('requirements.txt').read_bytes()\n"
        "sif.write_bytes(b'SIF' + d.read_bytes() + req + ' '.join(a).encode())\n"
    )
    path.chmod(stat.S_IRWXU)
    return path


def test_build_writes_the_image_and_its_digest(tmp_path):
    envs = tmp_path / "envs"
    envs.mkdir()
    (envs / "img.def").write_text("Bootstrap: docker\nFrom: x\n%files\n    requirements.txt /r\n")
    (envs / "requirements.txt").write_text("numpy\n")
    runtime = fake_runtime(tmp_path / "apptainer")
    sif, digest = tmp_path / "containers" / "img.sif", tmp_path / "containers" / "img.digest.json"
    record = build_image(runtime, envs / "img.def", sif, digest, fakeroot=True)
    data = sif.read_bytes()
    assert data.startswith(b"SIFBootstrap") and b"numpy" in data and b"--fakeroot" in data
    assert json.loads(digest.read_text()) == record
    assert record["sha256"] == hashlib.sha256(data).hexdigest()
    assert record["runtime"] == "apptainer version 1.3.6"
    assert not list(tmp_path.glob("containers/*.incomplete"))


def test_a_failed_build_leaves_no_image(tmp_path):
    (tmp_path / "img.def").write_text("Bootstrap: docker\n")
    runtime = fake_runtime(tmp_path / "apptainer", fail=True)
    sif, digest = tmp_path / "out" / "img.sif", tmp_path / "out" / "img.digest.json"
    with pytest.raises(RuntimeError, match="building img.sif .* failed \\(exit 255\\)"):
        build_image(runtime, tmp_path / "img.def", sif, digest, fakeroot=False)
    assert not sif.exists() and not digest.exists() and not list((tmp_path / "out").iterdir())


@pytest.mark.workflow
def test_build_container_rule_builds_with_the_clusters_runtime(tmp_path):
    """The rule through Snakemake, with an `apptainer` stand-in on the PATH."""
    import os

    from support import make_workdir, run_snakemake

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_runtime(bin_dir / "apptainer")
    workdir = make_workdir(tmp_path / "work")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    target = "containers/megatron-nvidia.sif"
    run_snakemake(workdir, "-c1", target, "--config", "cluster=juwels", env=env)
    digest = json.loads((workdir / "containers" / "megatron-nvidia.digest.json").read_text())
    data = (workdir / target).read_bytes()
    assert digest["sha256"] == hashlib.sha256(data).hexdigest()
    assert b"MEGATRON_COMMIT" in data and b"--fakeroot" in data  # JUWELS builds with fakeroot


def test_an_image_for_another_architecture_is_not_built(tmp_path):
    (tmp_path / "img.def").write_text("Bootstrap: docker\n")
    (tmp_path / "requirements.txt").write_text("numpy\n")
    runtime = fake_runtime(tmp_path / "apptainer")
    sif, digest = tmp_path / "out" / "img.sif", tmp_path / "out" / "img.digest.json"
    other = "aarch64" if platform.machine() != "aarch64" else "x86_64"
    with pytest.raises(RuntimeError, match=f"GPU nodes are {other}.*Build it on a {other}"):
        build_image(runtime, tmp_path / "img.def", sif, digest, fakeroot=False, cpu_arch=other)
    assert not sif.exists()
    record = build_image(
        runtime, tmp_path / "img.def", sif, digest, fakeroot=False, cpu_arch=platform.machine()
    )
    assert record["arch"] == platform.machine()


def test_builds_cache_and_unpack_under_scratch(tmp_path):
    from hpcllm.containers import build_env

    env = build_env("$MYSCRATCH", {"MYSCRATCH": str(tmp_path), "APPTAINER_CACHEDIR": "/mine"})
    assert env["APPTAINER_CACHEDIR"] == "/mine"  # the user's own choice is kept
    assert env["SINGULARITY_CACHEDIR"] == f"{tmp_path}/hpcllm-cache/apptainer"
    assert env["APPTAINER_TMPDIR"] == f"{tmp_path}/hpcllm-cache/apptainer-tmp"
    assert (tmp_path / "hpcllm-cache" / "apptainer-tmp").is_dir()
    assert "APPTAINER_TMPDIR" not in build_env("$UNSET_SCRATCH", {})  # runtime defaults
