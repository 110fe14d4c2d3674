import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.offline import go_offline

go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)

from hpcllm import logs
from hpcllm.vision.datasets_config import make_sample

logs.setup(snakemake.log[0])
make_sample(
    snakemake.wildcards.dataset, snakemake.params.dataset, snakemake.output[0], snakemake.threads
)
