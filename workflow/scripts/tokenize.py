import os

import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.launch import go_offline

go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)

os.environ["RAYON_NUM_THREADS"] = str(snakemake.threads)  # before tokenizers starts its pool

from hpcllm import logs
from hpcllm.text.shards import manifest_documents
from hpcllm.text.tokenization import tokenize_shard
from hpcllm.text.tokenizers_config import tokenizer_for

logs.setup(snakemake.log[0])
cfg = snakemake.params.tokenizer
tokenize_shard(
    snakemake.input.jsonl,
    snakemake.params.prefix,
    tokenizer_for(cfg, snakemake.input.tokenizer),
    cfg["eod_token"],
    append_eod=snakemake.params.tokenize["append_eod"],
    encoder=snakemake.params.tokenize["encoder"],
    batch_bytes=snakemake.params.tokenize["batch_bytes"],
    special_tokens_in_text=snakemake.params.tokenize["special_tokens_in_text"],
    total_documents=manifest_documents(snakemake.input.jsonl),
)
