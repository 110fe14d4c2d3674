import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.offline import go_offline

go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)

from hpcllm import logs
from hpcllm.training.engines.cache import build_index_cache
from hpcllm.training.plan.passes import check_passes

logs.setup(snakemake.log[0])
# The exact passes over each source, now that they are tokenized: stop before any
# training segment when the plan reads a source more often than data.max_passes allows.
print(check_passes(snakemake.wildcards.experiment, snakemake.params.prepared), flush=True)
build_index_cache(snakemake.params.prepared, snakemake.params.folder, snakemake.output.manifest)
