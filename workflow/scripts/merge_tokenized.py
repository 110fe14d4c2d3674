import logging

from hpcllm import logs
from hpcllm.text.indexed_dataset import merge_datasets

logs.setup(snakemake.log[0])
index = merge_datasets(snakemake.params.shard_prefixes, snakemake.params.prefix)
logging.info(
    "merged %d shards: %d documents, %d tokens",
    len(snakemake.params.shard_prefixes),
    len(index.sequence_lengths),
    index.num_tokens,
)
