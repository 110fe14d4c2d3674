# Image trees to one LMDB per dataset and split (read by the vision benchmark, which
# stages them to node-local storage with hpcllm.vision.stage_in, see docs/vision.md).


include: "vision_functions.smk"


rule make_sample_images:
    output:
        directory("data/vision/sample/{dataset}"),
    log:
        "logs/make_sample_images/{dataset}.log",
    wildcard_constraints:
        dataset="|".join(IMAGE_DATASETS) or "NONE",
    conda:
        "../../envs/workflow.yaml"
    threads: 2
    params:
        dataset=image_dataset_config,
    script:
        "../scripts/make_sample_images.py"


rule pack_lmdb:
    input:
        tree=image_tree,
    output:
        lmdb=directory("data/vision/{dataset}/{split}.lmdb"),
        report="data/vision/{dataset}/{split}.report.json",
    log:
        "logs/pack_lmdb/{dataset}/{split}.log",
    benchmark:
        "results/timings/pack_lmdb/{dataset}/{split}.tsv"
    wildcard_constraints:
        dataset="|".join(IMAGE_DATASETS) or "NONE",
        split="train|val",
    conda:
        "../../envs/workflow.yaml"
    threads: 4
    resources:
        mem_mb=8000,
        runtime=360,
    params:
        dataset=image_dataset_config,
        vision={k: VISION[k] for k in ("on_bad_image", "check") if k in VISION},
        module=PACK_JOB,
    # shell:, not script: Snakemake's script machinery cost each job 0.04-0.13 CPU-s here,
    # like tar + sync's whole CPU on a small split (docs/measurements/vision.md). The dicts
    # go as their Python literals, the values Snakemake records for them, as with script:.
    shell:
        "{params.module} --dataset {wildcards.dataset:q}"
        " --dataset-config {params.dataset:q} --vision {params.vision:q}"
        " --split {wildcards.split:q} --lmdb {output.lmdb:q} --report {output.report:q}"
        " --log {log:q} --threads {threads}"
