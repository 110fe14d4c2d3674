# Pre-flight on the real site (docs/clusters.md, "Pre-flight"): per image a site probe,
# per GPU job type a canary at minimal size; the GPU jobs wait for their canary's record.
# Only on Slurm clusters with GPUs (PREFLIGHT): elsewhere no rule here is part of a plan.
# Each output's job is keyed by what it checked (params.key): Snakemake reruns it exactly
# when that changes; `--forcerun site_probe` runs the probe (and what follows) again.


include: "preflight_functions.smk"


rule site_probe:
    input:
        image=probe_inputs,
    output:
        record=probe_record("{image}"),
    log:
        "logs/site_probe/{image}.log",
    wildcard_constraints:
        image="|".join(PROBE_IMAGES) if PREFLIGHT else "NONE",
    conda:
        "../../envs/workflow.yaml"
    threads: 1
    resources:
        **preflight_qos(_probe.RUNTIME_MIN),
        slurm_partition=preflight_partition(),
        nodes=1,
        tasks=1,
        tasks_per_gpu=0,
        mpi="",
        gres=lambda wc: preflight_resources(
            "bench_vision" if PROBE_IMAGES[wc.image] == ["vision"] else "train_segment"
        )["gres"],
        cpus_per_task=lambda wc: preflight_resources("train_segment")["cpus_per_task"],
        mem_mb=lambda wc: preflight_resources("train_segment")["mem_mb"],
        runtime=_probe.RUNTIME_MIN,
        slurm_extra=probe_slurm_extra,
    params:
        # Recorded by Snakemake: a change of what the probe checks runs it again.
        key=probe_key,
        modules=probe_modules,
        cluster=CLUSTER,
        # What the chain's jobs are submitted with, for the probe's sbatch test.
        submit=_probe.submit_options(CLUSTER, _profile_resources),
        answers=f"{PREFLIGHT_DIR}/probe/{{image}}.answers.json",
    script:
        "../scripts/site_probe.py"


rule canary:
    input:
        unpack(canary_inputs),
    output:
        record=f"{PREFLIGHT_DIR}/canary/{{kind}}.json",
    log:
        "logs/canary/{kind}.log",
    wildcard_constraints:
        kind="|".join(CANARY_KINDS) if PREFLIGHT else "NONE",
    conda:
        "../../envs/workflow.yaml"
    threads: 1
    resources:
        # the development QOS where a two-node canary fits it
        **preflight_qos(_canary.RUNTIME_MIN, nodes=2),
        slurm_partition=preflight_partition(),
        # Two nodes where the plan's jobs of its type run on more than one: the real
        # rendezvous and an all-reduce over the fabric (hpcllm.preflight.canary).
        nodes=canary_nodes_of,
        tasks=canary_nodes_of,
        tasks_per_gpu=0,
        mpi="",
        gres=canary_resource("gres"),
        cpus_per_task=canary_resource("cpus_per_task"),
        mem_mb=canary_resource("mem_mb"),
        runtime=_canary.RUNTIME_MIN,
        slurm_extra=canary_slurm_extra,
    params:
        # Recorded by Snakemake: a change of what the canary checks runs it again.
        key=canary_key,
        source=canary_source_of,
        nodes=canary_nodes_of,
        cluster=CLUSTER,
        work=f"{PREFLIGHT_DIR}/canary/{{kind}}",
        time_limit_s=canary_time_limit_s,
        schema=f"{HPCLLM_ROOT}/workflow/schemas/benchmarks.schema.yaml",
    script:
        "../scripts/canary.py"
