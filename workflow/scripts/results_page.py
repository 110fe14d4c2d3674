from pathlib import Path

import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)
import pandas as pd

from hpcllm import logs
from hpcllm.results_page import cluster_without_gpus, experiment_view, render_page, write_page

logs.setup(snakemake.log[0])
inputs = dict(snakemake.input.items())
summary = pd.read_csv(inputs["summary"]) if "summary" in inputs else None
plots = {k[len("plot_") :]: Path(v) for k, v in inputs.items() if k.startswith("plot_")}
views = [
    experiment_view(
        Path("."),
        name,
        prepared,
        Path(inputs[f"loss_{name}"]),
        snakemake.params.max_gpu_hours,
        Path(f"results/train/{name}/forecast.png"),  # one of snakemake.output.forecasts
    )
    for name, prepared in vars(snakemake.params.experiments).items()
]
cluster = snakemake.params.cluster
page = render_page(
    f"hpcllm results ({cluster})",
    summary,
    plots,
    views,
    without_gpus=cluster_without_gpus(cluster),
)
write_page(snakemake.output[0], page)
