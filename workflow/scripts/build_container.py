import shutil

import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm import logs
from hpcllm.containers import build_image

logs.setup(snakemake.log[0])
runtime = shutil.which(snakemake.params.runtime) or snakemake.params.runtime
build_image(
    runtime,
    snakemake.input.definition,
    snakemake.output.sif,
    snakemake.output.digest,
    fakeroot=snakemake.params.fakeroot,
    extra_args=snakemake.params.build_args,
    cpu_arch=snakemake.params.cpu_arch,
    scratch=snakemake.params.scratch,
)
