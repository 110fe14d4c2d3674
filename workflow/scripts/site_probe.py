import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.offline import go_offline

go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)

from hpcllm import logs
from hpcllm.preflight.probe import run_probe

logs.setup(snakemake.log[0])
run_probe(
    snakemake.params.cluster,
    snakemake.input.image[0] if snakemake.input.image else None,
    snakemake.params.modules,
    snakemake.params.key,
    snakemake.output.record,
    snakemake.params.answers,
    snakemake.params.submit,
)
