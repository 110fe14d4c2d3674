import logging

import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.offline import go_offline

go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)

from hpcllm import logs
from hpcllm.text.indexed_dataset import merge_datasets
from hpcllm.text.shard_pool import check_batch_outputs
from hpcllm.text.shards import check_source_size

logs.setup(snakemake.log[0])
# Shards written by tokenize_batch jobs (inputs: the batches' records) are not Snakemake's
# outputs: check that they are still the ones the batches wrote before merging them.
for record in snakemake.input.shards:
    if record.endswith(".json"):
        check_batch_outputs(record)
check_source_size(
    snakemake.wildcards.source, snakemake.params.manifests, snakemake.params.min_documents
)
index = merge_datasets(snakemake.params.shard_prefixes, snakemake.params.prefix)
logging.info(
    "merged %d shards: %d documents, %d tokens",
    len(snakemake.params.shard_prefixes),
    len(index.sequence_lengths),
    index.num_tokens,
)
