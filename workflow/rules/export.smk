# Export of training checkpoints as Hugging Face model folders (docs/export.md): the
# checkpoint of each segment an experiment's `export.segments` names (its last by
# default) into results/export/<experiment>/iter_<NNNNNNN>/, with export.json last.


include: "export_functions.smk"


rule export_model:
    input:
        # A rerun segment rewrites its record: the export of its checkpoint runs again.
        record=export_segment_record,
        tokenizer=training_tokenizer,
    output:
        record="results/export/{experiment}/iter_{iteration}/export.json",
    log:
        "logs/export_model/{experiment}/iter_{iteration}.log",
    benchmark:
        "results/timings/export_model/{experiment}/iter_{iteration}.tsv"
    wildcard_constraints:
        experiment="|".join(EXPERIMENTS) or "NONE",
        iteration=r"\d{7}",
    conda:
        "../../envs/workflow.yaml"
    threads: 1
    resources:
        runtime=export_runtime,
        mem_mb=export_mem_mb,
    params:
        prepared=prepared_experiment,
        # Recorded by Snakemake: a changed experiment (its segments' settings) or other
        # export settings rerun this export; the script refuses checkpoints trained
        # with other settings than these.
        settings=weight_settings,
        dtype=export_dtype,
        transformer_impl=export_transformer_impl,
        save="checkpoints/{experiment}",
    script:
        "../scripts/export_model.py"
