import os

import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.offline import go_offline

go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)

os.environ["RAYON_NUM_THREADS"] = str(snakemake.threads)  # before tokenizers starts its pool

from hpcllm import logs
from hpcllm.text.shards import source_policy, tokenize_source_shard
from hpcllm.text.tokenizers_config import tokenizer_for

logs.setup(snakemake.log[0])
name, shard = snakemake.wildcards.source, int(snakemake.wildcards.shard)
cfg, num_shards = snakemake.params.source, snakemake.params.num_shards
tok_cfg = snakemake.params.tokenizer
tokenize_source_shard(
    name,
    cfg,
    source_policy(cfg, snakemake.params.defaults, shard, num_shards),
    shard,
    num_shards,
    snakemake.params.prefix,
    snakemake.output[2],
    tokenizer_for(tok_cfg, snakemake.input.tokenizer),
    tok_cfg["eod_token"],
    append_eod=snakemake.params.tokenize["append_eod"],
    encoder=snakemake.params.tokenize["encoder"],
    batch_bytes=snakemake.params.tokenize["batch_bytes"],
    special_tokens_in_text=snakemake.params.tokenize["special_tokens_in_text"],
)
