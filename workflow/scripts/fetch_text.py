import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm import logs
from hpcllm.text.fetch import fetch_source

logs.setup(snakemake.log[0])
fetch_source(
    snakemake.wildcards.source,
    snakemake.params.source,
    snakemake.params.files,
    snakemake.output.manifest,
)
