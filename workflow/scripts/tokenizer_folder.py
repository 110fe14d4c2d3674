import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm import logs
from hpcllm.text.tokenizers_config import write_hf_folder

logs.setup(snakemake.log[0])
write_hf_folder(snakemake.params.tokenizer, list(snakemake.input.files), snakemake.params.out_dir)
