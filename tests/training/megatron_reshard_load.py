"""The load side of test_reshard_megatron.py: one process (TP=1, PP=1, gloo) builds the
GPTModel of a case saved by tests/export/megatron_ranks.py at TP=2, loads that
``torch_dist`` checkpoint with Megatron Core's ``dist_checkpointing`` into its own
sharded state dict (the resharding Megatron-LM's load_checkpoint does), and writes its
logits on the case's tokens.

Run as ``python megatron_reshard_load.py <request.json> <logits out>`` with RANK=0,
WORLD_SIZE=1, MASTER_ADDR and MASTER_PORT set."""

import json
import os
import sys
import warnings

warnings.simplefilter("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main() -> None:
    case = json.load(open(sys.argv[1]))["cases"][0]
    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from hpcllm.training.engines.megatron_model import cuda_is_the_cpu, materialize

    parallel_state.initialize_model_parallel(1, 1)
    torch.Tensor.cuda = lambda self, *a, **k: self  # as in megatron_ranks.py: no GPU
    config = materialize({**case["config"], "use_cpu_initialization": True,
                          "pipeline_model_parallel_size": 1, "tensor_model_parallel_size": 1})  # fmt: skip
    torch.manual_seed(99)  # another draw than the saved weights: the load must replace it
    with cuda_is_the_cpu():
        model = GPTModel(
            config=config,
            transformer_layer_spec=get_gpt_layer_local_spec(),
            vocab_size=case["vocab"],
            max_sequence_length=case["max_positions"],
            share_embeddings_and_output_weights=True,
            position_embedding_type=case["position_embedding_type"],
        )
        loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, case["save"])
        model.load_state_dict(loaded["model"])
        model.eval()
        tokens = torch.tensor(case["tokens"])
        batch, seq = tokens.shape
        positions = torch.arange(seq).unsqueeze(0).expand(batch, seq)
        mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool)).logical_not()[None, None]
        with torch.no_grad():
            torch.save(model(tokens, positions, mask), sys.argv[2])
    print("saved at TP=2, loaded at TP=1:", os.path.basename(case["save"]), flush=True)
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
