import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.offline import go_offline

go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)

from hpcllm import logs
from hpcllm.text.shards import source_shard_readers
from hpcllm.text.tokenizer_train import train_bpe

logs.setup(snakemake.log[0])
cfg = snakemake.params.tokenizer
train_bpe(
    source_shard_readers(snakemake.params.sources, snakemake.params.defaults),
    snakemake.params.out_dir,
    vocab_size=cfg["vocab_size"],
    special_tokens=cfg["special_tokens"],
    sample_documents=cfg["sample_documents"],
)
