import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.offline import go_offline

go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)

from hpcllm import logs
from hpcllm.bench.runner import run_vision_point
from hpcllm.clusters import load_cluster

logs.setup(snakemake.log[0])
point = snakemake.params.point
run_vision_point(
    point,
    snakemake.input.lmdb,
    snakemake.output.log,
    snakemake.output.record,
    snakemake.output.settings,
    load_cluster(point["cluster"]),
    container=snakemake.params.container,
    time_limit_s=snakemake.params.time_limit_s,
    val_lmdb=snakemake.input.get("val"),
)
