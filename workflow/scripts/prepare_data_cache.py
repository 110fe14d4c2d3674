import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.launch import go_offline

go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)

from hpcllm import logs
from hpcllm.training.cache import build_index_cache

logs.setup(snakemake.log[0])
build_index_cache(snakemake.params.prepared, snakemake.params.folder, snakemake.output.manifest)
