import shutil

import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm import logs
from hpcllm.containers import build_image, build_image_cotainr

logs.setup(snakemake.log[0])
if snakemake.params.method == "cotainr":
    build_image_cotainr(
        shutil.which("cotainr") or "cotainr",
        snakemake.input.recipe,
        snakemake.output.sif,
        snakemake.output.digest,
        base_image=snakemake.params.base_image,
        cpu_arch=snakemake.params.cpu_arch,
        scratch=snakemake.params.scratch,
    )
else:
    build_image(
        shutil.which(snakemake.params.runtime) or snakemake.params.runtime,
        snakemake.input.recipe,
        snakemake.output.sif,
        snakemake.output.digest,
        fakeroot=snakemake.params.fakeroot,
        extra_args=snakemake.params.build_args,
        cpu_arch=snakemake.params.cpu_arch,
        scratch=snakemake.params.scratch,
    )
