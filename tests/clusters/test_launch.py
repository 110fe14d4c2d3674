"""The launch builder: the exact command per cluster, and the script it gives, run."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support import hang_guard

from hpcllm.clusters import load_cluster
from hpcllm.launch import build_launch, shell_word

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "config" / "clusters"
ENV = {"HPCLLM_GPU_PARTITION": "g", "HPCLLM_CPU_PARTITION": "c", "HPCLLM_DEVEL_PARTITION": "d"}

# What each rank runs first (LUMI, JUPITER, JEDI): bind to its GPU's cores, then exec.
RANK_BIND_CODE = (
    "import os,sys;m=int(sys.argv[1].split(',')[int(os.environ['LOCAL_RANK'])],16);"
    "os.sched_setaffinity(0,[c for c in range(m.bit_length()) if m>>c&1]);"
    "os.execvp(sys.argv[2],sys.argv[2:])"
)
# JUPITER's and JEDI's masks: GPU i's Grace chip, cores 72i to 72i+71 (NUMA domain i).
GH200_MASKS = ",".join("0x" + "f" * 18 + "0" * (18 * i) for i in range(4))
# What the batch job runs on 2 nodes, all GPUs of a node, in the image c.sif.
PINNED = {
    "deucalion": (
        "srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --kill-on-bad-exit=1 --cpu-bind=none singularity exec --nv --bind $HPCLLM_SCRATCH c.sif"
        " torchrun --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d --rdzv_endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv_id ${SLURM_JOB_ID} --no-python python train.py"
    ),
    "discoverer": (
        "srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --kill-on-bad-exit=1 --cpu-bind=none apptainer exec --nv --bind $HPCLLM_SCRATCH c.sif"
        " torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv_id ${SLURM_JOB_ID} --no-python python train.py"
    ),
    # The task bound to the node's 288 cores, each rank to the 72 of its GPU's Grace.
    "jedi": (
        "srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --kill-on-bad-exit=1 --cpu-bind=mask_cpu:0x"
        + "f" * 72
        + " apptainer exec --nv --bind $SCRATCH c.sif"
        " env -u PMIX_SECURITY_MODE torchrun_jsc --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d --rdzv_endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv_id ${SLURM_JOB_ID} --no-python"
        " python -c " + RANK_BIND_CODE + " " + GH200_MASKS + " python train.py"
    ),
    "jupiter": (
        "srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --kill-on-bad-exit=1 --cpu-bind=mask_cpu:0x"
        + "f" * 72
        + " apptainer exec --nv --bind $SCRATCH c.sif"
        " env -u PMIX_SECURITY_MODE torchrun_jsc --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d --rdzv_endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv_id ${SLURM_JOB_ID} --no-python"
        " python -c " + RANK_BIND_CODE + " " + GH200_MASKS + " python train.py"
    ),
    "jureca": (
        "srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --kill-on-bad-exit=1 --cpu-bind=none apptainer exec --nv --bind $SCRATCH c.sif"
        " env -u PMIX_SECURITY_MODE torchrun_jsc --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d --rdzv_endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv_id ${SLURM_JOB_ID} --no-python python train.py"
    ),
    "juwels": (
        "srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --kill-on-bad-exit=1 --cpu-bind=none apptainer exec --nv --bind $SCRATCH c.sif"
        " env -u PMIX_SECURITY_MODE torchrun_jsc --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d --rdzv_endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv_id ${SLURM_JOB_ID} --no-python python train.py"
    ),
    "karolina": (
        "srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --kill-on-bad-exit=1 --cpu-bind=none apptainer exec --nv --bind $HPCLLM_SCRATCH,/lscratch c.sif"
        " torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv_id ${SLURM_JOB_ID} --no-python python train.py"
    ),
    "leonardo": (
        "srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --kill-on-bad-exit=1 --cpu-bind=none singularity exec --nv --bind $CINECA_SCRATCH,$TMPDIR c.sif"
        " torchrun --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d --rdzv_endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv_id ${SLURM_JOB_ID} --no-python python train.py"
    ),
    # The task bound to the 56 cores of LUMI's documented GCD masks, each rank to its GCD's.
    "lumi": (
        "srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --kill-on-bad-exit=1 --cpu-bind=mask_cpu:0xfefefefefefefefe singularity exec --rocm --bind /var/spool/slurmd,/opt/cray,/usr/lib64/libcxi.so.1,/usr/lib64/libjansson.so.4,$HPCLLM_SCRATCH,$HPCLLM_SCRATCH/hpcllm-cache/Megatron-LM-5be9626709af2722333bf54797c954c09edeada3:/opt/Megatron-LM c.sif"
        " torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv_id ${SLURM_JOB_ID} --no-python"
        " python -c "
        + RANK_BIND_CODE
        + " 0x00fe000000000000,0xfe00000000000000,0x0000000000fe0000,0x00000000fe000000,0x00000000000000fe,0x000000000000fe00,0x000000fe00000000,0x0000fe0000000000"
        " python train.py"
    ),
    "meluxina": (
        "srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --kill-on-bad-exit=1 --cpu-bind=none apptainer exec --nv --bind $HPCLLM_SCRATCH c.sif"
        " torchrun --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d --rdzv_endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv_id ${SLURM_JOB_ID} --no-python python train.py"
    ),
    "mn5": (
        "srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --kill-on-bad-exit=1 --cpu-bind=none singularity exec --nv --bind $HPCLLM_SCRATCH,$TMPDIR c.sif"
        " torchrun --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d --rdzv_endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv_id ${SLURM_JOB_ID} --no-python python train.py"
    ),
    "vega": (
        "srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --kill-on-bad-exit=1 --cpu-bind=none apptainer exec --nv --bind $HPCLLM_SCRATCH c.sif"
        " torchrun --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d --rdzv_endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv_id ${SLURM_JOB_ID} --no-python python train.py"
    ),
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_command_for_every_cluster_is_pinned(name):
    cluster = load_cluster(name, ROOT, environ=ENV)
    launch = build_launch(
        cluster,
        nodes=2,
        procs_per_node=cluster.gpus_per_node,
        command=["python", "train.py"],
        container="c.sif",
    )
    assert " ".join(launch.argv) == PINNED[name]
    assert "MASTER_PORT" not in launch.env  # the job script derives it from the job id


def test_local_runs_torchrun_standalone_or_the_bare_command():
    local = load_cluster("local", ROOT)
    two = build_launch(local, nodes=1, procs_per_node=2, command=["python", "t.py"])
    # The venv's own torchrun: jobs run without activating the environment.
    assert two.argv[0] == str(Path(sys.executable).parent / "torchrun")
    assert two.argv == [
        two.argv[0],
        "--standalone",
        "--nproc_per_node",
        "2",
        "--no-python",
        "python",
        "t.py",
    ]
    one = build_launch(local, nodes=1, procs_per_node=1, command=["python", "t.py"])
    assert one.argv == ["python", "t.py"]
    assert "scontrol" not in one.shell() and "srun" not in one.shell()
    with pytest.raises(ValueError, match="no scheduler"):
        build_launch(local, nodes=2, procs_per_node=1, command=["python"])
    with pytest.raises(ValueError, match="container_runtime is 'none'"):
        build_launch(local, nodes=1, procs_per_node=1, command=["python"], container="x.sif")


def test_more_processes_than_gpus_is_refused():
    juwels = load_cluster("juwels", ROOT)
    with pytest.raises(ValueError, match="5 processes per node.*4 GPUs"):
        build_launch(juwels, nodes=1, procs_per_node=5, command=["python"])


@pytest.mark.parametrize(
    "text", ["; rm -rf ~", "$(touch pwned)", "`touch pwned`", "a'b\"c", "", "x && y | z > f"]
)
def test_shell_words_stay_harmless_strings(text, tmp_path):
    out = subprocess.run(
        ["bash", "-c", f"printf '%s' {shell_word(text)}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.stdout == text and not (tmp_path / "pwned").exists()


def test_variable_references_expand_at_run_time():
    word = shell_word("${SCRATCH}/cache/$USER-x")
    out = subprocess.run(
        ["bash", "-c", f"printf '%s' {word}"],
        env={"SCRATCH": "/s p", "USER": "u;rm", "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
    )
    assert out.stdout == "/s p/cache/u;rm-x"


def fake_tools(bin_dir: Path) -> None:
    """srun, scontrol and apptainer stand-ins: Slurm and Apptainer cannot run here.

    srun records its argv and the environment it got; scontrol expands a node list.
    """
    bin_dir.mkdir()
    recorder = (
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)},"
        " open(os.environ['RECORD'], 'w'))\n"
    )
    # A long node list: reading only its first line must not break the pipe (pipefail).
    scontrol = (
        "#!/bin/bash\n"
        'if [ "$1 $2 $3 $4" = "show job -o 4711" ]; then\n'
        "  echo 'JobId=4711 JobName=x NumNodes=2 NumCPUs=96 NumTasks=2 CPUs/Task=48 "
        "ReqB:S:C:T=0:0:*:*'; exit 0\nfi\n"
        '[ "$1 $2" = "show hostnames" ] || exit 1\n'
        "printf 'jwb0042\\njwb0043\\n'; seq -f 'jwb%04g' 44 20000\n"
    )
    for name, text in {"srun": recorder, "scontrol": scontrol}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)


def test_job_script_resolves_the_rendezvous_host_and_exports_the_environment(tmp_path):
    fake_tools(tmp_path / "bin")
    juwels = load_cluster("juwels", ROOT)
    launch = build_launch(
        juwels,
        nodes=2,
        procs_per_node=4,
        command=["python", "pretrain_gpt.py", "--data-path", "; rm -rf ~"],
        container="img.sif",
        master_port=29512,
    )
    script = tmp_path / "job.sh"
    script.write_text(launch.shell())
    record = tmp_path / "record.json"
    env = {
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "RECORD": str(record),
        "SLURM_JOB_NODELIST": "jwb[0042-0043]",
        "SLURM_JOB_ID": "4711",
        "SLURM_CPUS_PER_TASK": "48",
        "SCRATCH": "/p/scratch/proj",
    }
    proc = subprocess.run(
        ["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(record.read_text())
    argv = got["argv"]
    assert argv[argv.index("--rdzv_endpoint") + 1] == "jwb0042i:29512"
    assert argv[argv.index("--rdzv_id") + 1] == "4711"
    assert argv[-4:] == ["python", "pretrain_gpt.py", "--data-path", "; rm -rf ~"]
    # the scratch bind of config/clusters/juwels.yaml, expanded in the job
    assert argv[argv.index("exec") + 1 : argv.index("exec") + 5] == [
        "--nv",
        "--bind",
        "/p/scratch/proj",
        "img.sif",
    ]
    assert got["env"]["HF_HOME"] == "/p/scratch/proj/hpcllm-cache/huggingface"
    assert got["env"]["SRUN_CPUS_PER_TASK"] == "48"
    assert got["env"]["NCCL_SOCKET_IFNAME"] == "ib0"
    assert got["env"]["PMIX_SECURITY_MODE"] == "native"  # for srun; unset inside (env -u)
    assert ["env", "-u", "PMIX_SECURITY_MODE"] == argv[
        argv.index("img.sif") + 1 : argv.index("img.sif") + 4
    ]


def juwels_job_script(tmp_path):
    """A 2-node, 4-rank JUWELS launch script with fake srun/scontrol (they record what the
    step gets): the script, the job's environment and the record's path."""
    fake_tools(tmp_path / "bin")
    launch = build_launch(
        load_cluster("juwels", ROOT), nodes=2, procs_per_node=4, command=["python", "t.py"]
    )
    script = tmp_path / "job.sh"
    script.write_text(launch.shell())
    record = tmp_path / "record.json"
    env = {
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "RECORD": str(record),
        "SLURM_JOB_NODELIST": "jwb[0042-0043]",  # squeue's answer in a real job
        "SLURM_JOB_ID": "4711",
        "SCRATCH": "/p/scratch/proj",
    }
    return script, env, record


def test_job_script_reads_cpus_per_task_back_when_the_job_step_hid_it(tmp_path):
    """The Slurm plugin's job step removes SLURM_CPUS_PER_TASK (and the node list) before
    the rule runs; srun's tasks would then get one core each. The script asks the job."""
    script, env, record = juwels_job_script(tmp_path)
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(record.read_text())
    assert got["env"]["SRUN_CPUS_PER_TASK"] == "48"
    # Another job id: scontrol fails, the variable stays unset and the step still starts.
    proc = subprocess.run(
        ["bash", str(script)], env={**env, "SLURM_JOB_ID": "1"}, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "SRUN_CPUS_PER_TASK" not in json.loads(record.read_text())["env"]


def test_the_rendezvous_port_comes_from_the_job_id(tmp_path):
    """Two jobs on one node (a shared partition, two test clusters on one host) must not
    both take torchrun's 29500: each job's port is derived from its id."""
    script, env, record = juwels_job_script(tmp_path)
    endpoints = {}
    for job_id in ("4711", "4712", "19711"):
        proc = subprocess.run(
            ["bash", str(script)],
            env={**env, "SLURM_JOB_ID": job_id},
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        got = json.loads(record.read_text())
        argv = got["argv"]
        endpoints[job_id] = argv[argv.index("--rdzv_endpoint") + 1]
        assert got["env"]["MASTER_PORT"] == endpoints[job_id].split(":")[1]
    assert endpoints == {
        "4711": "jwb0042i:19711",
        "4712": "jwb0042i:19712",
        "19711": "jwb0042i:19711",  # ids 15000 apart share a port (test clusters' blocks)
    }


def test_job_script_stops_when_the_scratch_variable_is_unset(tmp_path):
    fake_tools(tmp_path / "bin")
    launch = build_launch(load_cluster("juwels", ROOT), nodes=1, procs_per_node=1, command=["true"])
    script = tmp_path / "job.sh"
    script.write_text(launch.shell())
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "RECORD": str(tmp_path / "r")}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "SCRATCH is not set" in proc.stderr and "juwels.yaml" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_local_launch_runs_two_real_ranks(tmp_path):
    """The local script runs torchrun --standalone; the two gloo ranks all-reduce."""
    pytest.importorskip("torch")
    worker = tmp_path / "worker.py"
    worker.write_text(
        "import os, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.tensor([dist.get_rank() + 1.0])\n"
        "dist.all_reduce(t)\n"
        "open(f'rank{dist.get_rank()}.txt', 'w').write(f'{dist.get_world_size()} {t.item()}')\n"
        "dist.barrier()\n"
        "dist.destroy_process_group()\n"
    )
    launch = build_launch(
        load_cluster("local", ROOT),
        nodes=1,
        procs_per_node=2,
        command=[sys.executable, str(worker)],
    )
    script = tmp_path / "job.sh"
    script.write_text(launch.shell())
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=hang_guard(5),  # ~5 s
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == ["2 3.0", "2 3.0"]


# ---- the launches of the workflow's GPU steps, pinned (issue 15: untested until now)

# What a language benchmark point runs on JUWELS: GPT-3 175B, strong scaling, 128 nodes
# (the smallest count whose memory fits 40 GB A100s: 64 needs ~38.9 GB with bf16's fp32
# main gradients).
BENCH_175B_POINT = "language.gpt3_175b.strong.bf16.n0128"
PINNED_BENCH_175B = (
    "python /opt/Megatron-LM/pretrain_gpt.py --num-layers 96 --hidden-size 12288"
    " --num-attention-heads 96 --seq-length 2048 --max-position-embeddings 2048"
    " --position-embedding-type learned_absolute --make-vocab-size-divisible-by 128"
    " --transformer-impl transformer_engine --tensor-model-parallel-size 4"
    " --pipeline-model-parallel-size 32 --sequence-parallel --use-distributed-optimizer"
    " --overlap-grad-reduce --overlap-param-gather"
    " --attention-backend flash --recompute-granularity selective --micro-batch-size 1"
    " --global-batch-size 1536 --train-iters 20 --exit-signal-handler --exit-signal SIGUSR2 --bf16 --optimizer adam"
    " --adam-beta1 0.9 --adam-beta2 0.95 --weight-decay 0.1 --clip-grad 1 --lr 6e-05 --min-lr"
    " 6e-06 --lr-decay-style cosine --lr-warmup-iters 0 --attention-dropout 0"
    " --hidden-dropout 0 --seed 1234 --mock-data --split 100,0,0 --data-cache-path"
    " /p/scratch/proj/runs/language.gpt3_175b.strong.bf16.n0128/index-cache --tokenizer-type"
    " NullTokenizer --vocab-size 50257 --log-interval 1 --log-throughput --tensorboard-dir"
    " /p/scratch/proj/runs/language.gpt3_175b.strong.bf16.n0128/tensorboard --eval-interval"
    " 20 --eval-iters 0 --distributed-backend nccl"
)
# Segment 2 of config/experiments/opengptx_800m.yaml on JUWELS, 1425 minutes left.
PINNED_SEGMENT_800M = (
    "python /opt/Megatron-LM/pretrain_gpt.py --num-layers 16 --hidden-size 2048"
    " --num-attention-heads 8 --seq-length 2048 --max-position-embeddings 2048"
    " --position-embedding-type rope --make-vocab-size-divisible-by 128 --transformer-impl"
    " transformer_engine --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1"
    " --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce"
    " --overlap-param-gather --attention-backend flash"
    " --micro-batch-size 4 --global-batch-size 512 --train-iters 30000 --exit-interval 6000"
    " --exit-duration-in-mins 1425 --exit-signal-handler --exit-signal SIGUSR2 --bf16 --optimizer adam --adam-beta1"
    " 0.9 --adam-beta2 0.95 --weight-decay 0.1 --clip-grad 1 --lr 0.00025 --min-lr 2.5e-05"
    " --lr-decay-style cosine --lr-warmup-iters 500 --attention-dropout 0 --hidden-dropout 0"
    " --seed 1234 --data-path 1 data/tokenized/sample_bpe/fineweb_text_document --split"
    " 949,50,1 --data-cache-path checkpoints/opengptx_800m/data_cache --tokenizer-type"
    " HuggingFaceTokenizer --tokenizer-model data/tokenizers/sample_bpe"
    " --save checkpoints/opengptx_800m --load"
    " checkpoints/opengptx_800m --save-interval 500 --log-interval 10 --log-throughput"
    " --tensorboard-dir checkpoints/opengptx_800m/tensorboard --eval-interval 3000"
    " --eval-iters 1 --distributed-backend nccl"
)


def juwels_points() -> dict[str, dict]:
    from hpcllm.bench.sweeps import expand_all, facts_of

    experiments = {
        "language": str(REPO / "config/experiments/language.yaml"),
        "vision": str(REPO / "config/experiments/vision.yaml"),
    }
    juwels = load_cluster("juwels", ROOT)
    return {p.id: p.row() for p in expand_all(experiments, facts_of(juwels))}


def test_megatron_command_of_a_language_benchmark_point_is_pinned():
    from hpcllm.bench.language import engine_command

    point = juwels_points()[BENCH_175B_POINT]
    command = engine_command(point, f"/p/scratch/proj/runs/{BENCH_175B_POINT}", "python")
    assert " ".join(command) == PINNED_BENCH_175B


def test_megatron_command_of_a_training_segment_is_pinned():
    import yaml

    from hpcllm.training.engines.command import engine_command
    from hpcllm.training.plan.experiment import Paths, prepare_experiment

    spec = yaml.safe_load((REPO / "config/experiments/opengptx_800m.yaml").read_text())
    # over the examples' tokenizer, as tests/data/opengptx_on_samples.yaml plans it
    spec["training"]["experiments"]["opengptx_800m"]["data"]["tokenizer"] = "sample_bpe"
    text = {
        "tokenizers": {"sample_bpe": {"vocab_size": 8000}},
        "tokenize": {"tokenizers": ["sample_bpe"]},
        "sources": {"fineweb": {}},
    }
    name = "opengptx_800m"
    prepared = prepare_experiment(
        name, spec["training"]["experiments"][name], text, load_cluster("juwels", ROOT)
    )
    save = f"checkpoints/{name}"
    paths = Paths(save, "seg2.json", "seg2.engine.log", f"{save}/data_cache", f"{save}/tensorboard")
    command = engine_command(
        prepared.experiment,
        prepared.layout,
        prepared.blend,
        prepared.tokenizer_files,
        paths,
        2,
        1425,
        python="python",  # the image's, as run_segment passes in a container (python_for)
    )
    assert " ".join(command) == PINNED_SEGMENT_800M


def test_benchmark_launch_on_slurm_runs_the_checkout_in_the_image():
    """A point's launch on JUWELS: srun on all its nodes, the image with the checkout's
    src/ bound and on PYTHONPATH (the image has no hpcllm), one launcher per node."""
    from hpcllm.bench.runner import launch_for

    point = next(p for p in juwels_points().values() if p["benchmark"] == "vision")
    point = {**point, "nodes": 2}
    src = str(REPO / "src")
    command = ["python", "-m", "hpcllm.bench.vision_train", "--settings", "s.json"]
    launch = launch_for(point, load_cluster("juwels", ROOT), command, "c.sif")
    assert " ".join(launch.argv) == (
        "srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --kill-on-bad-exit=1 --cpu-bind=none"
        f" apptainer exec --nv --bind $SCRATCH,{src} c.sif env -u PMIX_SECURITY_MODE"
        " torchrun_jsc --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d"
        " --rdzv_endpoint ${MASTER_ADDR}:${MASTER_PORT} --rdzv_id ${SLURM_JOB_ID} --no-python"
        " python -m hpcllm.bench.vision_train --settings s.json"
    )
    assert launch.env["PYTHONPATH"] == src
    assert f"export PYTHONPATH={src}" in launch.shell()


def test_benchmark_launch_without_slurm_runs_a_process_per_gpu_of_the_point():
    from hpcllm.bench.runner import launch_for

    local = load_cluster("local", ROOT)
    point = {"id": "p", "nodes": 2, "procs_per_node": 1, "gpus": 2}
    launch = launch_for(point, local, ["python", "t.py"], None)
    assert launch.argv[1:5] == ["--standalone", "--nproc_per_node", "2", "--no-python"]
    assert "PYTHONPATH" not in launch.env  # this environment has hpcllm installed


def test_torch_engine_segment_in_a_container_runs_the_images_python_on_the_checkout():
    """The images have no hpcllm: a torch-engine segment in one runs the image's `python`
    with the checkout's src/ bound and on PYTHONPATH (not this venv's interpreter path)."""
    import yaml
    from snakemake.utils import validate

    from hpcllm.launch import package_in_container, python_for
    from hpcllm.training.engines.command import engine_command
    from hpcllm.training.plan.experiment import Paths, prepare_experiment

    config = yaml.safe_load((REPO / "config/examples/local.yaml").read_text())
    for section in ("text", "training"):  # the schema's defaults, as the workflow fills them
        validate(config[section], str(REPO / f"workflow/schemas/{section}.schema.yaml"))
    name = "tiny_local"
    prepared = prepare_experiment(
        name, config["training"]["experiments"][name], config["text"], load_cluster("juwels", ROOT)
    )
    save = f"checkpoints/{name}"
    paths = Paths(save, "seg1.json", "seg1.engine.log", f"{save}/data_cache", f"{save}/tb")
    image = "containers/train-nvidia.sif"
    command = engine_command(
        prepared.experiment,
        prepared.layout,
        prepared.blend,
        prepared.tokenizer_files,
        paths,
        1,
        None,
        python=python_for(image),
    )
    assert command[:3] == ["python", "-m", "hpcllm.training.engines.torch_engine"]
    binds, env = package_in_container(image)
    assert binds == [env["PYTHONPATH"]]
    assert (
        Path(env["PYTHONPATH"]) / "hpcllm" / "training" / "engines" / "torch_engine.py"
    ).is_file()
    launch = build_launch(
        load_cluster("juwels", ROOT),
        nodes=1,
        procs_per_node=1,
        command=command,
        container=image,
        binds=binds,
        env=env,
    )
    bound = launch.argv[launch.argv.index("--bind") + 1].split(",")
    assert env["PYTHONPATH"] in bound
    assert f"PYTHONPATH={env['PYTHONPATH']}" in launch.shell()
    # Outside a container: this environment's interpreter, nothing bound.
    assert python_for(None) == sys.executable and package_in_container(None) == ([], {})


# ---- issue 21: what a job gets from the site facts (offline hub, threads, CPU binding)

GPU_CLUSTERS = sorted(PINNED)


@pytest.mark.parametrize("name", GPU_CLUSTERS)
def test_every_rank_gets_the_cores_of_one_gpu_and_no_hub(name):
    from hpcllm.clusters import OFFLINE_ENV

    cluster = load_cluster(name, ROOT, environ=ENV)
    launch = build_launch(
        cluster, nodes=2, procs_per_node=cluster.gpus_per_node, command=["python", "t.py"]
    )
    per_gpu = cluster.cpus_per_node // cluster.gpus_per_node
    assert launch.env["OMP_NUM_THREADS"] == str(per_gpu)
    assert {k: launch.env[k] for k in OFFLINE_ENV} == OFFLINE_ENV
    script = launch.shell()
    assert f"export OMP_NUM_THREADS={per_gpu}\n" in script
    assert all(f"export {k}=1\n" in script for k in OFFLINE_ENV)


def test_the_ranks_thread_count_is_not_the_jobs(tmp_path):
    """Snakemake exports OMP_NUM_THREADS = the rule's threads (a whole node's 48 cores on
    JUWELS) to the job; the script sets each rank's share of the node instead."""
    script, env, record = juwels_job_script(tmp_path)
    env.update(OMP_NUM_THREADS="48", HF_HUB_OFFLINE="0")
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(record.read_text())["env"]
    assert got["OMP_NUM_THREADS"] == "12"  # 48 cores / 4 GPUs
    assert got["HF_HUB_OFFLINE"] == got["TRANSFORMERS_OFFLINE"] == "1"
    assert got["HF_DATASETS_OFFLINE"] == "1"


def test_a_cluster_files_thread_count_wins(tmp_path):
    local = build_launch(load_cluster("local", ROOT), nodes=1, procs_per_node=2, command=["x"])
    assert local.env["OMP_NUM_THREADS"] == "1"  # config/clusters/local.yaml's, no GPUs
    root = write_cluster(tmp_path / "c", "site", env={"OMP_NUM_THREADS": "3"})
    launch = build_launch(load_cluster("site", root), nodes=1, procs_per_node=4, command=["x"])
    assert launch.env["OMP_NUM_THREADS"] == "3"


def test_go_offline_sets_the_hub_variables_in_this_process():
    from hpcllm.offline import go_offline

    environ = {"HF_HUB_OFFLINE": "0", "PATH": "/bin"}
    go_offline(environ)
    assert environ == {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PATH": "/bin",
    }


def write_cluster(root: Path, name: str, **facts) -> Path:
    """A cluster file in ``root``: JUWELS' facts with ``facts`` replaced."""
    import yaml

    raw = yaml.safe_load((ROOT / "juwels.yaml").read_text())
    raw.update(facts)
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{name}.yaml").write_text(yaml.safe_dump(raw))
    return root


def test_each_rank_is_bound_to_the_cores_of_its_gpu(tmp_path):
    """The wrapper LUMI's ranks run: the LOCAL_RANK-th mask, then the command itself."""
    from hpcllm.launch import bind_rank_to_gpu_cores

    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs cores 0 and 1")
    root = write_cluster(
        tmp_path / "c", "two", gpus_per_node=2, cpus_per_node=2, gpu_cpu_masks=["0x1", "0x2"],
        srun_args=[],
    )  # fmt: skip
    cluster = load_cluster("two", root)
    probe = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    argv = bind_rank_to_gpu_cores(cluster, probe)
    assert argv[0] == sys.executable  # the command's own interpreter runs the wrapper
    for rank, cores in (("0", "[0]"), ("1", "[1]")):
        out = subprocess.run(
            argv, env={**os.environ, "LOCAL_RANK": rank}, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == cores
    launch = build_launch(cluster, nodes=2, procs_per_node=2, command=probe)
    assert "--cpu-bind=mask_cpu:0x3" in launch.argv and "--cpu-bind=none" not in launch.argv
    assert launch.argv[-len(argv) :] == argv


@pytest.mark.parametrize("name", ["jupiter", "jedi"])
def test_gh200_ranks_get_the_72_cores_of_their_gpus_grace(name, monkeypatch):
    """A JUPITER/JEDI node: 4 GH200, GPU i paired with Grace chip i, whose 72 cores are
    NUMA domain i (JSC's numactl listing). Each rank (LOCAL_RANK i drives cuda:i) is bound
    to chip i's cores and runs 72 threads, not 72 threads floating over all 288 cores."""
    from hpcllm.launch import _BIND_CODE

    cluster = load_cluster(name, ROOT, environ=ENV)
    assert "apps.fz-juelich.de/jsc/hps/jedi/affinity.html" in Path(cluster.path).read_text()
    launch = build_launch(cluster, nodes=2, procs_per_node=4, command=["python", "t.py"])
    assert "--cpu-bind=none" not in launch.argv
    assert "--cpu-bind=mask_cpu:0x" + "f" * 72 in launch.argv  # the task: all 288 cores
    assert launch.env["OMP_NUM_THREADS"] == "72"
    assert launch.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # cuda:i is nvidia-smi's GPU i
    start = launch.argv.index("--no-python") + 1
    assert launch.argv[start : start + 3] == ["python", "-c", _BIND_CODE]
    masks = launch.argv[start + 3]
    # The rank's wrapper as it runs, up to the system calls.
    bound = {}
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: bound.update(cores=cores))
    monkeypatch.setattr(os, "execvp", lambda *argv: bound.update(argv=argv))
    for rank in range(4):
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setattr(sys, "argv", ["-c", masks, "python", "t.py"])
        exec(_BIND_CODE, {})
        assert bound["cores"] == list(range(72 * rank, 72 * rank + 72)), rank
        assert bound["argv"] == ("python", ["python", "t.py"])


@pytest.mark.parametrize(
    "facts, message",
    [
        ({"gpu_cpu_masks": ["0x1"]}, "1 masks for 4 GPUs"),
        ({"gpu_cpu_masks": ["0x3", "0xc", "0x30", "0xc0"]}, "holds 2 cores, but"),
        ({"cpus_per_node": 8, "gpu_cpu_masks": ["0x3", "0x3", "0x30", "0xc0"]}, "overlap"),
        ({"cpus_per_node": 8, "gpu_cpu_masks": ["0x3", "0xc", "0x30", "0xc0"]}, "drop the"),
        ({"env_globs": {"LIB": "/opt/x/*/lib; rm"}}, "env_globs.LIB"),
    ],
)
def test_binding_and_glob_facts_are_checked(tmp_path, facts, message):
    from hpcllm.clusters import ClusterError

    root = write_cluster(tmp_path / "c", "bad", **facts)
    with pytest.raises(ClusterError, match=message):
        load_cluster("bad", root)


def test_a_version_folder_is_found_when_the_job_starts(tmp_path):
    """LUMI's libfabric version is not written in the facts: the newest folder that
    matches the glob, or a stop naming the pattern."""
    fake_tools(tmp_path / "bin")
    lib = tmp_path / "libfabric"
    pattern = f"{lib}/*/lib64"
    root = write_cluster(
        tmp_path / "c", "site", env={"LIBS": "/plugin:$FABRIC:/usr/lib64"},
        env_globs={"FABRIC": pattern},
    )  # fmt: skip
    launch = build_launch(load_cluster("site", root), nodes=1, procs_per_node=1, command=["x"])
    script = tmp_path / "job.sh"
    script.write_text(launch.shell())
    record = tmp_path / "record.json"
    env = {
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "RECORD": str(record),
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_JOB_ID": "4711",
        "SCRATCH": "/s",
    }
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 1 and f"no path matches {pattern}" in proc.stderr
    assert not record.exists()
    for version in ("1.15.2.0", "1.22.0", "1.9.1"):
        (lib / version / "lib64").mkdir(parents=True)
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(record.read_text())["env"]["LIBS"] == f"/plugin:{lib}/1.22.0/lib64:/usr/lib64"
