import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.offline import go_offline

go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)

from hpcllm import logs
from hpcllm.vision.datasets_config import pack_dataset_split

logs.setup(snakemake.log[0])
pack_dataset_split(
    snakemake.wildcards.dataset,
    snakemake.params.dataset,
    snakemake.params.vision,
    snakemake.wildcards.split,
    snakemake.output.lmdb,
    snakemake.output.report,
    threads=snakemake.threads,
)
