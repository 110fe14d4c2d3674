import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.offline import go_offline

go_offline()  # the tokenizer and model are read from local files only

from pathlib import Path

from hpcllm import logs
from hpcllm.export.folder import export
from hpcllm.training.plan.settings import weight_settings

logs.setup(snakemake.log[0])
prepared = snakemake.params.prepared
export(
    snakemake.wildcards.experiment,
    snakemake.input.record,
    snakemake.params.save,
    weight_settings(prepared, snakemake.params.transformer_impl),
    list(snakemake.input.tokenizer),
    prepared.eod_token,
    Path(snakemake.output.record).parent,
    dtype=snakemake.params.dtype,
)
