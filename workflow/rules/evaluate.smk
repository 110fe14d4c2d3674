# Evaluation of each experiment's exported last checkpoint (docs/evaluation.md):
# lm-evaluation-harness on the tasks of its `evaluate` key and held-out perplexity on its
# own validation split, each its own job (changing the tasks, shots or limit reruns only
# the tasks; a new export reruns both), gathered into results/eval/<exp>/scores.csv.


include: "evaluate_functions.smk"


rule stage_eval_tasks:
    # On the login node: the tasks found, and their hub datasets downloaded where the
    # login nodes reach the hub (else the plan's failure names where to stage them). The
    # compute jobs read these local copies only.
    output:
        manifest="data/eval_tasks/{experiment}.json",
    log:
        "logs/stage_eval_tasks/{experiment}.log",
    wildcard_constraints:
        experiment="|".join(EVALUATED) or "NONE",
    localrule: True
    conda:
        "../../envs/workflow.yaml"
    params:
        tasks=lambda wildcards: eval_settings(wildcards)["tasks"],
        tasks_dir=EVAL_TASKS_DIR,
        online=CLUSTER.internet.login,
        site=CLUSTER.description,
        facts=CLUSTER.path,
    script:
        "../scripts/stage_eval_tasks.py"


rule evaluate_tasks:
    input:
        export=eval_export_record,
        tasks="data/eval_tasks/{experiment}.json",
        container=eval_container,
    output:
        "results/eval/{experiment}/iter_{iteration}/tasks.json",
    log:
        "logs/evaluate_tasks/{experiment}/iter_{iteration}.log",
    benchmark:
        "results/timings/evaluate_tasks/{experiment}/iter_{iteration}.tsv"
    wildcard_constraints:
        experiment="|".join(EVALUATED) or "NONE",
        iteration=r"\d{7}",
    conda:
        "../../envs/workflow.yaml"
    threads: 1
    resources:
        nodes=1,
        gres=eval_gres,
        runtime=120,
        mem_mb=16000,
    params:
        # Recorded by Snakemake: changing one reruns this job (and the table), not the
        # perplexity.
        shots=lambda wildcards: eval_settings(wildcards)["shots"],
        limit=lambda wildcards: eval_settings(wildcards)["limit"],
        cache_dir=EVAL_CACHE_DIR,
        container=lambda wildcards: (eval_container(wildcards) or [None])[0],
        cluster=CLUSTER,
    script:
        "../scripts/evaluate_model.py"


rule evaluate_perplexity:
    input:
        export=eval_export_record,
        data=training_data,
        container=eval_container,
    output:
        "results/eval/{experiment}/iter_{iteration}/perplexity.json",
    log:
        "logs/evaluate_perplexity/{experiment}/iter_{iteration}.log",
    benchmark:
        "results/timings/evaluate_perplexity/{experiment}/iter_{iteration}.tsv"
    wildcard_constraints:
        experiment="|".join(EVALUATED) or "NONE",
        iteration=r"\d{7}",
    conda:
        "../../envs/workflow.yaml"
    threads: 1
    resources:
        nodes=1,
        gres=eval_gres,
        runtime=60,
        mem_mb=16000,
    params:
        prefixes=eval_source_prefixes,
        split=eval_split,
        seq_length=experiment_seq_length,
        max_tokens=lambda wildcards: eval_settings(wildcards)["perplexity_tokens"],
        container=lambda wildcards: (eval_container(wildcards) or [None])[0],
        cluster=CLUSTER,
    script:
        "../scripts/evaluate_model.py"


rule evaluation_table:
    # The experiment's scores of its current export only (each record names the export
    # it read; another is refused), and in lm_eval/ the lm-eval command that reproduces
    # the tasks' scores with the task files it reads (none for tasks: []).
    input:
        unpack(eval_table_inputs),
    output:
        table="results/eval/{experiment}/scores.csv",
        lm_eval=directory("results/eval/{experiment}/lm_eval"),
    log:
        "logs/evaluation_table/{experiment}.log",
    wildcard_constraints:
        experiment="|".join(EVALUATED) or "NONE",
    localrule: True
    conda:
        "../../envs/workflow.yaml"
    params:
        cache_dir=EVAL_CACHE_DIR,
    script:
        "../scripts/evaluation_table.py"
