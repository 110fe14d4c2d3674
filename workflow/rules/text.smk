# Raw web text to Megatron's indexed dataset: fetch (hub sources without a mirror only),
# tokenizer, tokenize (straight from the source's files), merge.


include: "text_functions.smk"


rule fetch_text:
    input:
        hub_source_reachable,
    output:
        manifest="data/hub/{source}/fetched.json",
    log:
        "logs/fetch_text/{source}.log",
    benchmark:
        "results/timings/fetch_text/{source}.tsv"
    # On the login node: compute nodes of most EuroHPC sites cannot reach the hub. Only
    # for hub sources without a mirror; it copies the repository's files, never re-encodes.
    localrule: True
    conda:
        "../../envs/workflow.yaml"
    params:
        source=source_config,
        files=lambda wildcards: f"data/hub/{wildcards.source}/files",
    script:
        "../scripts/fetch_text.py"


rule train_tokenizer:
    input:
        sources=tokenizer_training_inputs,
    output:
        tokenizer="data/tokenizers/{tok}/tokenizer.json",
        vocab="data/tokenizers/{tok}/vocab.json",
        merges="data/tokenizers/{tok}/merges.txt",
        hf_config="data/tokenizers/{tok}/tokenizer_config.json",
    log:
        "logs/train_tokenizer/{tok}.log",
    benchmark:
        "results/timings/train_tokenizer/{tok}.tsv"
    conda:
        "../../envs/workflow.yaml"
    threads: 4
    resources:
        mem_mb=16000,
        runtime=120,
    params:
        tokenizer=tokenizer_training,
        sources=tokenizer_training_sources,
        defaults=TEXT_DEFAULTS,
        out_dir=subpath(output.tokenizer, parent=True),
    script:
        "../scripts/train_tokenizer.py"


rule tokenizer_folder:
    # A given (type: files) tokenizer as the engines read it: Megatron's
    # HuggingFaceTokenizer takes the folder, offline, its EOD from tokenizer_config.json
    # (never GPT2BPETokenizer, which takes a gpt2 snapshot in HF_HOME over given files).
    input:
        files=tokenizer_inputs,
    output:
        tokenizer="data/tokenizers/{tok}/hf/tokenizer.json",
        hf_config="data/tokenizers/{tok}/hf/tokenizer_config.json",
    log:
        "logs/tokenizer_folder/{tok}.log",
    wildcard_constraints:
        tok=GIVEN_TOKENIZERS,
    localrule: True
    conda:
        "../../envs/workflow.yaml"
    params:
        tokenizer=tokenizer_use,
        out_dir=subpath(output.tokenizer, parent=True),
    script:
        "../scripts/tokenizer_folder.py"


rule tokenize:
    input:
        source=source_inputs,
        tokenizer=tokenizer_inputs,
    output:
        multiext(
            "data/tokenized/{tok}/{source}/{shard}_text_document",
            bin=".bin",
            idx=".idx",
            manifest=".manifest.json",
        ),
    log:
        "logs/tokenize/{tok}/{source}/{shard}.log",
    benchmark:
        "results/timings/tokenize/{tok}/{source}/{shard}.tsv"
    conda:
        "../../envs/workflow.yaml"
    threads: tokenize_threads
    resources:
        mem_mb=4000,
        runtime=60,
    # The package's module from shell: a script: job costs about 0.2 CPU-s more (Snakemake's
    # nbformat import, a second Python unpickling the job); the configs go as JSON.
    params:
        module=TOKENIZE_JOB,
        source=source_read_argument,
        num_shards=source_num_shards,
        defaults=job_argument(TEXT_DEFAULTS),
        tokenizer=tokenizer_use_argument,
        tokenize=job_argument(TOKENIZE_SETTINGS),
        prefix=subpath(output.bin, strip_suffix=".bin"),
    shell:
        "{params.module} --source {wildcards.source:q}"
        " --shard {wildcards.shard} --num-shards {params.num_shards}"
        " --source-config {params.source:q} --defaults {params.defaults:q}"
        " --tokenizer-config {params.tokenizer:q} --tokenizer-files {input.tokenizer:q}"
        " --settings {params.tokenize:q} --prefix {params.prefix:q}"
        " --manifest {output.manifest:q} --threads {threads} --log {log:q}"


# Many shards in one job, side by side (text.tokenize.shards_per_job > 1: GPU sites where
# every job holds a whole node). Its output is the batch's record only: the shards'
# .bin/.idx are written by hpcllm.text.shard_pool, so a failed shard does not delete the
# others' and a rerun redoes it alone (docs/text.md, "Many CPU jobs on GPU-only sites").
rule tokenize_batch:
    input:
        shards=batch_inputs,
        tokenizer=tokenizer_inputs,
    output:
        "data/tokenized/{tok}/{source}/batch{batch}.json",
    log:
        "logs/tokenize_batch/{tok}/{source}/batch{batch}.log",
    benchmark:
        "results/timings/tokenize_batch/{tok}/{source}/batch{batch}.tsv"
    conda:
        "../../envs/workflow.yaml"
    threads: batch_threads
    resources:
        # 1 GB a thread (of the batch as submitted: a dry run caps threads at --cores)
        mem_mb=batch_mem_mb,
        runtime=batch_runtime,
    params:
        shards=batch_shards,
        source=source_read_config,
        num_shards=source_num_shards,
        defaults=TEXT_DEFAULTS,
        tokenizer=tokenizer_use,
        tokenize=TOKENIZE_SETTINGS,
        shard_threads=TOKENIZE_THREADS,
        cpus=batch_threads,
        out_dir=subpath(output[0], parent=True),
        log_dir=lambda wildcards: f"logs/tokenize/{wildcards.tok}/{wildcards.source}",
    script:
        "../scripts/tokenize_batch.py"


rule merge_tokenized:
    input:
        shards=tokenized_shards,
        manifests=tokenized_manifests,
    output:
        multiext("data/tokenized/{tok}/{source}_text_document", ".bin", ".idx"),
    log:
        "logs/merge_tokenized/{tok}/{source}.log",
    benchmark:
        "results/timings/merge_tokenized/{tok}/{source}.tsv"
    conda:
        "../../envs/workflow.yaml"
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        shard_prefixes=tokenized_shard_prefixes,
        manifests=shard_manifests,
        prefix=subpath(output[0], strip_suffix=".bin"),
        min_documents=source_min_documents,
    script:
        "../scripts/merge_tokenized.py"
