"""What each site reaches and how it makes its images (config/clusters: internet,
container_build): LUMI builds with cotainr, MareNostrum 5 builds nothing and has no
internet, so the plan refuses what cannot run there and takes a copied image as it is."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import stat
import sys
from pathlib import Path

import pytest
import yaml
from support import REPO, make_workdir, run_snakemake

from hpcllm.clusters import Internet, known_clusters, load_cluster
from hpcllm.containers import (
    build_image_cotainr,
    checkout_megatron,
    cotainr_env,
    cotainr_recipe,
    image_plan_error,
    megatron_checkout_dir,
    megatron_pin,
    missing_index,
    requirement_lines,
)
from hpcllm.models.megatron_args import MEGATRON_LM_COMMIT

ROOT = REPO / "config" / "clusters"
MN5_ENV = {
    "HPCLLM_ACCOUNT": "proj0042",
    "HPCLLM_GPU_PARTITION": "acc",
    "HPCLLM_QOS": "acc_bsccase",
    "HPCLLM_SCRATCH": "/gpfs/scratch/proj0042/me",
}


def test_every_site_says_what_it_reaches_with_a_source():
    for name in known_clusters(ROOT):
        text = (ROOT / f"{name}.yaml").read_text()
        assert "\ninternet: {login: " in text, name
        above = text.split("\ninternet: ")[0].rsplit("\n", 1)[-1]
        assert above.startswith("# "), f"{name}: the internet fact has no comment above it"
    mn5, lumi, juwels = (load_cluster(n, ROOT) for n in ("mn5", "lumi", "juwels"))
    assert mn5.internet == Internet(login=False, compute=False)
    assert mn5.container_build.method == "copy"
    assert juwels.internet == Internet(login=True, compute=False)
    assert juwels.container_build.method == "definition" and juwels.container_build.fakeroot
    assert lumi.internet == Internet(login=True, compute=False)
    assert lumi.container_build.method == "cotainr"
    assert lumi.container_build.base_image.startswith("/appl/local/containers/sif-images/")


def test_cotainr_without_a_base_image_is_refused(tmp_path):
    raw = yaml.safe_load((ROOT / "lumi.yaml").read_text())
    del raw["container_build"]["base_image"]
    (tmp_path / "site.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(
        ValueError, match="site.yaml: container_build.method is cotainr.*base_image"
    ):
        load_cluster("site", tmp_path)


def test_image_plan_errors_per_site(tmp_path):
    definition = REPO / "envs" / "megatron-nvidia.def"
    sif = tmp_path / "containers" / "megatron-nvidia.sif"
    mn5 = load_cluster("mn5", ROOT, environ=MN5_ENV)
    message = image_plan_error(mn5, "megatron-nvidia", sif, definition)
    assert "containers/megatron-nvidia.sif is missing" in message
    assert "container_build.method: copy" in message and str(sif) in message
    # built on the login node, which has internet: nothing to say
    juwels = load_cluster("juwels", ROOT)
    assert image_plan_error(juwels, "megatron-nvidia", sif, definition) is None
    # a site whose build place has no internet: say so, and how to copy instead
    offline = dataclasses.replace(juwels, internet=Internet(login=False, compute=False))
    message = image_plan_error(offline, "megatron-nvidia", sif, definition)
    assert "login nodes of JUWELS Booster (JSC) have no internet" in message
    assert "internet.login" in message and "method: copy" in message
    # an image in place is taken as it is, whatever the site
    sif.parent.mkdir()
    sif.write_bytes(b"SIF")
    assert image_plan_error(mn5, "megatron-nvidia", sif, definition) is None
    assert image_plan_error(offline, "megatron-nvidia", sif, definition) is None


def test_lumi_cotainr_environment_is_the_images_software():
    template = yaml.safe_load(cotainr_recipe(REPO / "envs" / "megatron-rocm.def").read_text())
    requirements = requirement_lines(REPO / "envs" / "requirements.txt")
    env = cotainr_env(template, requirements)
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "python=3.12" in env["dependencies"] and "pip" in env["dependencies"]
    assert pip[0].startswith("torch==2.6.0+rocm") and pip[1].startswith("torchvision==")
    # Megatron-LM at the commit the arguments are generated for
    assert pip[2] == (
        f"megatron-core @ git+https://github.com/NVIDIA/Megatron-LM.git@{MEGATRON_LM_COMMIT}"
    )
    assert pip[3:] == requirements and "lmdb>=1.4" in pip
    # the template is not changed, and a package it names keeps its line
    assert len(template["dependencies"][-1]["pip"]) == 3
    again = cotainr_env({"dependencies": [{"pip": ["lmdb==1.0"]}]}, ["lmdb>=1.4", "numpy"])
    assert again["dependencies"] == ["pip", {"pip": ["lmdb==1.0", "numpy"]}]
    assert "PIP_EXTRA_INDEX_URL" in missing_index(env, environ={})
    assert missing_index(env, environ={"PIP_EXTRA_INDEX_URL": "file:///wheels"}) is None


def fake_cotainr(path: Path) -> Path:
    """A `cotainr` stand-in (none can be installed here): records its arguments and the
    environment file it was given, and writes the image."""
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, pathlib, sys\n"
        "a = sys.argv[1:]\n"
        "if a == ['--version']: print('cotainr 2025.3.0'); sys.exit(0)\n"
        "env = next(x.split('=', 1)[1] for x in a if x.startswith('--conda-env='))\n"
        "pathlib.Path(a[1]).write_text(json.dumps({'argv': a,\n"
        "    'env': pathlib.Path(env).read_text()}))\n"
    )
    path.chmod(stat.S_IRWXU)
    return path


def test_cotainr_build_command_and_record(tmp_path):
    envs = tmp_path / "envs"
    envs.mkdir()
    (envs / "img.cotainr.yml").write_text(
        "dependencies: [python=3.12, {pip: [torch==2.6.0+rocm6.2.4]}]\n"
    )
    (envs / "requirements.txt").write_text("# comment\nnumpy>=1.26\n\nlmdb\n")
    tool = fake_cotainr(tmp_path / "cotainr")
    sif, digest = tmp_path / "containers" / "img.sif", tmp_path / "containers" / "img.digest.json"
    with pytest.raises(RuntimeError, match="PIP_EXTRA_INDEX_URL"):
        build_image_cotainr(
            tool, envs / "img.cotainr.yml", sif, digest, base_image="b.sif", environ={}
        )
    assert not sif.exists()
    record = build_image_cotainr(
        tool,
        envs / "img.cotainr.yml",
        sif,
        digest,
        base_image="/appl/base.sif",
        environ={"PIP_EXTRA_INDEX_URL": "file:///wheels"},
    )
    made = json.loads(sif.read_text())
    argv = made["argv"]
    assert argv[:2] == ["build", str(sif) + ".incomplete"]
    assert argv[2:] == [
        "--base-image=/appl/base.sif",
        f"--conda-env={sif.with_name('img.conda-env.yml')}.incomplete",
        "--accept-licenses",
    ]
    env = yaml.safe_load(made["env"])
    assert env["dependencies"][-1]["pip"] == [
        "--extra-index-url file:///wheels",
        "torch==2.6.0+rocm6.2.4",
        "numpy>=1.26",
        "lmdb",
    ]
    assert yaml.safe_load(sif.with_name("img.conda-env.yml").read_text()) == env
    assert json.loads(digest.read_text()) == record
    assert record["method"] == "cotainr" and record["base_image"] == "/appl/base.sif"


def fake_singularity(path: Path, make_fails: bool = False) -> Path:
    """A `singularity` stand-in for `exec --bind SRC:DST SIF CMD...` (none can run here):
    `make -C DST/...` writes a helpers module into SRC's folder (or fails), `python -c`
    fails unless one is there; each call is appended to ``<path>.log``."""
    path.write_text(
        f"#!{sys.executable}\n"
        "import pathlib, sys\n"
        "a = sys.argv[1:]\n"
        "with open(sys.argv[0] + '.log', 'a') as log: log.write(repr(a) + '\\n')\n"
        "assert a[:2] == ['exec', '--bind'] and pathlib.Path(a[3]).is_file(), a\n"
        "src, dst = a[2].split(':')\n"
        "folder = pathlib.Path(src, a[6].removeprefix(dst + '/')) if a[4] == 'make' else None\n"
        f"if folder and {make_fails!r}: sys.exit('helpers.cpp: error')\n"
        "if folder: (folder / 'helpers_cpp.cpython-312-x86_64-linux-gnu.so').write_bytes(b'ELF')\n"
        "found = list(pathlib.Path(src).glob('megatron/core/datasets/helpers_cpp*'))\n"
        "sys.exit(0 if found else 'ImportError: helpers_cpp')\n"
    )
    path.chmod(stat.S_IRWXU)
    return path


def test_cotainr_build_compiles_megatrons_helpers_in_its_checkout_inside_the_image(tmp_path):
    """LUMI's image gets Megatron-LM's scripts from a checkout bound at run time, whose
    dataset helpers nothing built: every job's rank 0 then ran `make` there at start-up
    without pybind11 and exited. The build compiles them with the new image and checks
    that they import, before the image is kept."""
    pin = f"megatron-core @ git+https://github.com/NVIDIA/Megatron-LM.git@{MEGATRON_LM_COMMIT}"
    template = tmp_path / "envs" / "img.cotainr.yml"
    template.parent.mkdir()
    template.write_text(yaml.safe_dump({"dependencies": ["python=3.12", {"pip": [pin]}]}))
    (template.parent / "requirements.txt").write_text("numpy\n")
    scratch = tmp_path / "scratch"
    checkout = Path(megatron_checkout_dir(str(scratch), MEGATRON_LM_COMMIT))
    (checkout / "megatron/core/datasets").mkdir(parents=True)  # a checkout at the pin
    (checkout / "pretrain_gpt.py").write_text("# at the pin\n")
    sif, digest = tmp_path / "containers" / "img.sif", tmp_path / "containers" / "img.json"
    tool = fake_cotainr(tmp_path / "cotainr")

    def build(runtime):
        return build_image_cotainr(
            tool, template, sif, digest, base_image="b.sif", scratch=str(scratch),
            runtime=runtime, environ={},
        )  # fmt: skip

    with pytest.raises(RuntimeError, match="dataset helpers in .*Megatron-LM-"):
        build(fake_singularity(tmp_path / "broken", make_fails=True))
    assert not sif.exists() and not digest.exists()
    record = build(fake_singularity(tmp_path / "singularity"))
    built = checkout / "megatron/core/datasets/helpers_cpp.cpython-312-x86_64-linux-gnu.so"
    assert record["megatron_helpers"] == [str(built)] and built.is_file()
    calls = [
        ast.literal_eval(line) for line in (tmp_path / "singularity.log").read_text().splitlines()
    ]
    run = ["exec", "--bind", f"{checkout}:/opt/Megatron-LM", f"{sif}.incomplete"]
    assert calls[0] == [*run, "make", "-C", "/opt/Megatron-LM/megatron/core/datasets"]
    assert calls[1][:6] == [*run, "python", "-c"] and "import helpers_cpp" in calls[1][6]


def offline_plan(workdir: Path, *extra: str, env: dict | None = None, check: bool = False):
    return run_snakemake(
        workdir,
        "-n",
        "--profile",
        "profiles/mn5",
        "--configfile",
        "config/experiments/opengptx_800m.yaml",
        str(REPO / "tests/data/opengptx_on_samples.yaml"),
        *extra,
        env={**MN5_ENV, **(env or {})},
        check=check,
    )


@pytest.mark.workflow
def test_mn5_plan_refuses_a_missing_image_and_says_where(tmp_path):
    workdir = make_workdir(tmp_path / "work")
    proc = offline_plan(workdir)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "containers/megatron-nvidia.sif is missing" in out
    assert str(workdir / "containers" / "megatron-nvidia.sif") in out
    assert "builds no images" in out and "apptainer build" in out


@pytest.mark.workflow
def test_mn5_plan_takes_a_copied_image_as_it_is(tmp_path):
    workdir = make_workdir(tmp_path / "work")
    (workdir / "containers").mkdir()
    for image in ("megatron-nvidia", "vision-nvidia"):
        sif = workdir / "containers" / f"{image}.sif"
        sif.write_bytes(b"an image built elsewhere")
        # copied in later than any recipe: a build rule would see it as outdated
        later = (REPO / "envs" / f"{image}.def").stat().st_mtime + 3600
        os.utime(sif, (later, later))
    proc = offline_plan(workdir, check=True)
    out = proc.stdout + proc.stderr
    assert "rule train_segment:" in out and "containers/megatron-nvidia.sif" in out
    assert "build_container" not in out  # no rule makes or replaces it on MN5


@pytest.mark.workflow
def test_mn5_plan_refuses_a_hub_download_without_a_mirror(tmp_path):
    workdir = make_workdir(tmp_path / "work")
    (workdir / "containers").mkdir()
    for image in ("megatron-nvidia", "vision-nvidia"):
        (workdir / "containers" / f"{image}.sif").write_bytes(b"SIF")
    extra = workdir / "web.yaml"
    source = {"type": "hub", "dataset": "org/web-text", "shards": 1}
    extra.write_text(yaml.safe_dump({"text": {"sources": {"web": source}}}))
    proc = offline_plan(workdir, str(extra))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "text.sources.web downloads org/web-text from the Hugging Face hub" in out
    assert "login nodes of MareNostrum 5 ACC (BSC)" in out and "internet.login" in out
    assert "HPCLLM_HF_MIRROR" in out and "text.sources.web.mirror" in out
    # staged where the message says: the plan goes ahead
    mirror = tmp_path / "mirror"
    (mirror / "org" / "web-text").mkdir(parents=True)
    proc = offline_plan(workdir, str(extra), env={"HPCLLM_HF_MIRROR": str(mirror)}, check=True)
    # read in place by the compute jobs (MN5 ACC jobs hold whole nodes: a node's worth of
    # shards per tokenize_batch job): no login-node step for a mirrored source
    out = proc.stdout + proc.stderr
    assert "rule tokenize_batch:" in out and "fetch_text" not in out


@pytest.mark.workflow
def test_build_container_rule_builds_with_cotainr_on_lumi(tmp_path):
    """The rule through Snakemake on LUMI's facts, with a `cotainr` stand-in on the PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_cotainr(bin_dir / "cotainr")
    fake_singularity(bin_dir / "singularity")
    workdir = make_workdir(tmp_path / "work")
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PIP_EXTRA_INDEX_URL": "file:///wheels",
        "HPCLLM_SCRATCH": str(tmp_path / "scratch"),
    }
    # the Megatron-LM checkout the build makes (from the hub of code, which is not
    # reachable here; checkout_megatron is tested on a local repository below)
    checkout = Path(megatron_checkout_dir(env["HPCLLM_SCRATCH"], MEGATRON_LM_COMMIT))
    (checkout / "megatron/core/datasets").mkdir(parents=True)
    (checkout / "pretrain_gpt.py").write_text("# at the pin\n")
    target = "containers/megatron-rocm.sif"
    run_snakemake(workdir, "-c1", target, "--config", "cluster=lumi", env=env)
    made = json.loads((workdir / target).read_text())
    base = load_cluster("lumi", ROOT).container_build.base_image
    assert made["argv"][0] == "build" and f"--base-image={base}" in made["argv"]
    assert "megatron-core @ git+" in made["env"] and "lmdb" in made["env"]
    digest = json.loads((workdir / "containers" / "megatron-rocm.digest.json").read_text())
    assert digest["method"] == "cotainr" and digest["megatron_checkout"] == str(checkout)
    helpers = checkout / "megatron/core/datasets/helpers_cpp.cpython-312-x86_64-linux-gnu.so"
    assert digest["megatron_helpers"] == [str(helpers)]  # made with the image, in the checkout


def test_lumi_binds_the_megatron_checkout_the_build_makes():
    lumi = load_cluster("lumi", ROOT)
    checkout = megatron_checkout_dir(lumi.scratch, MEGATRON_LM_COMMIT)
    assert f"{checkout}:/opt/Megatron-LM" in lumi.container_binds
    template = yaml.safe_load(cotainr_recipe(REPO / "envs" / "megatron-rocm.def").read_text())
    assert megatron_pin(template)[1] == MEGATRON_LM_COMMIT


def test_megatron_checkout_at_the_pin(tmp_path):
    import subprocess

    repo = tmp_path / "Megatron-LM"
    repo.mkdir()

    def git(*args):
        return subprocess.run(
            ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    git("init", "-q")
    (repo / "pretrain_gpt.py").write_text("v1\n")
    git("add", ".")
    git("commit", "-q", "-m", "one")
    pinned = git("rev-parse", "HEAD")
    (repo / "pretrain_gpt.py").write_text("v2\n")
    git("commit", "-q", "-am", "two")
    dest = tmp_path / "cache" / f"Megatron-LM-{pinned}"
    assert checkout_megatron(dest, str(repo), pinned) == dest
    assert (dest / "pretrain_gpt.py").read_text() == "v1\n"
    with pytest.raises(RuntimeError, match="checkout"):
        checkout_megatron(tmp_path / "other", str(repo), "0" * 40)
    assert not (tmp_path / "other").exists() and not list(tmp_path.glob("*.incomplete"))


@pytest.mark.parametrize(
    "name", [n for n in known_clusters(ROOT) if n not in ("local", "testcluster")]
)
def test_the_build_each_site_would_run(name, tmp_path):
    """Per site, the command its facts lead to: a rootless `apptainer build --fakeroot`,
    cotainr on the site's base image, or none (the image is copied in)."""
    from hpcllm.containers import build_command, cotainr_command

    cluster = load_cluster(name, ROOT, environ=MN5_ENV | {"HPCLLM_CPU_PARTITION": "c"})
    build = cluster.container_build
    sif, definition = tmp_path / "img.sif", REPO / "envs" / "megatron-nvidia.def"
    if build.method == "definition":
        # users build without root: only fakeroot makes a %post with apt-get work
        cmd = build_command(cluster.container_runtime, definition, sif, fakeroot=build.fakeroot)
        assert cmd[:3] == [cluster.container_runtime, "build", "--fakeroot"], name
        where = "compute" if build.on_compute_node else "login"
        assert getattr(cluster.internet, where), f"{name} builds where there is no internet"
    elif build.method == "cotainr":
        cmd = cotainr_command("cotainr", sif, build.base_image, tmp_path / "env.yml")
        assert cmd[1:3] == ["build", str(sif)] and cmd[3] == f"--base-image={build.base_image}"
        assert cluster.internet.login and not build.on_compute_node
    else:
        assert build.method == "copy" and name == "mn5"
