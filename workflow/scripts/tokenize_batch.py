import logging
import os

import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.offline import go_offline

go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)

from hpcllm import logs
from hpcllm.text.shard_pool import ShardTask, run_batch, write_batch_record
from hpcllm.text.sources import block

logs.setup(snakemake.log[0])
# In a Slurm job: the CPUs the job asked for (its threads as planned from the cluster's
# cores; the job step's Snakemake caps snakemake.threads at the cores it counts itself).
# Elsewhere: the job's threads.
cpus = snakemake.params.cpus if os.environ.get("SLURM_JOB_ID") else snakemake.threads
workers = max(1, min(len(snakemake.params.shards), cpus // snakemake.params.shard_threads))
# Each shard's process starts its own tokenizers pool: the job's CPUs shared out.
os.environ["RAYON_NUM_THREADS"] = str(max(1, cpus // workers))
logging.getLogger("hpcllm").info(
    "%d CPUs: %d shard(s) at a time, %s threads each",
    cpus,
    workers,
    os.environ["RAYON_NUM_THREADS"],
)
tasks = []
files, num_shards = list(snakemake.input.shards), snakemake.params.num_shards
for shard in snakemake.params.shards:
    # A shard's own block of files where there are enough (a fixed file reruns its shard
    # only), else all of them (the records are counted over every file).
    own = files[slice(*block(len(files), int(shard), num_shards))]
    prefix = os.path.join(snakemake.params.out_dir, f"{shard}_text_document")
    tasks.append(
        ShardTask(
            name=shard,
            prefix=prefix,
            # The source's files (a shard reads its block of them) and the tokenizer.
            inputs=(*(own if len(files) >= num_shards else files), *snakemake.input.tokenizer),
            log=os.path.join(snakemake.params.log_dir, f"{shard}.log"),
            kwargs={
                "source": snakemake.wildcards.source,
                "cfg": snakemake.params.source,
                "defaults": snakemake.params.defaults,
                "shard": int(shard),
                "num_shards": num_shards,
                "prefix": prefix,
                "tokenizer": snakemake.params.tokenizer,
                "tokenizer_files": list(snakemake.input.tokenizer),
                "settings": snakemake.params.tokenize,
            },
            suffixes=(".bin", ".idx", ".manifest.json"),
        )
    )
result = run_batch(tasks, "hpcllm.text.shard_pool:tokenize_source_task", workers)
write_batch_record(snakemake.output[0], tasks, result)
