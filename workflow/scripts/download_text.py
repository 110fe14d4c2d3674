import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm import logs
from hpcllm.text.shards import source_policy, write_shard

logs.setup(snakemake.log[0])
name, shard = snakemake.wildcards.source, int(snakemake.wildcards.shard)
cfg, num_shards = snakemake.params.source, snakemake.params.num_shards
write_shard(
    name,
    cfg,
    source_policy(cfg, snakemake.params.defaults, shard, num_shards),
    shard,
    num_shards,
    snakemake.output.jsonl,
    snakemake.output.manifest,
)
