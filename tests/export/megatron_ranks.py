"""One rank of a real multi-process Megatron Core run on the CPU (gloo): builds the
GPTModel stage of its (TP, PP) rank, saves a ``torch_dist`` checkpoint as Megatron-LM's
``save_checkpoint`` lays it out (the model's own ``sharded_state_dict``, common state in
``common.pt``) and a legacy one (``--ckpt-format torch``), and runs a pipelined forward on fixed token ids whose logits (gathered
over TP on the last stage) are the reference the export must reproduce.

Run as ``python megatron_ranks.py <request.json>`` once per rank, with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set. The request: {"tp", "pp", "cases": [{"name",
"config": TransformerConfig kwargs (JSON, see megatron_model.materialize), "vocab",
"max_positions", "position_embedding_type", "save", "legacy", "tokens", "logits"}]}.
"""

import argparse
import json
import os
import sys
import warnings

warnings.simplefilter("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main() -> None:
    request = json.load(open(sys.argv[1]))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from hpcllm.training.engines.megatron_model import cuda_is_the_cpu, materialize

    tp, pp = request["tp"], request["pp"]
    parallel_state.initialize_model_parallel(tp, pp)
    first = parallel_state.is_pipeline_first_stage()
    last = parallel_state.is_pipeline_last_stage()
    # No GPU: LanguageModule moves the tied output weight to the GPU before its all-reduce
    # between the first and the last stage; here that tensor stays on the CPU.
    # The checkpoint writer waits for the GPU's copies to finish: here there are none.
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.synchronize = lambda *a, **k: None
    for case in request["cases"]:
        config = materialize({**case["config"], "use_cpu_initialization": True,
                              "pipeline_model_parallel_size": pp,
                              "tensor_model_parallel_size": tp})  # fmt: skip
        torch.manual_seed(case.get("seed", 1))
        with cuda_is_the_cpu():
            model = GPTModel(
                config=config,
                transformer_layer_spec=get_gpt_layer_local_spec(),
                vocab_size=case["vocab"],
                max_sequence_length=case["max_positions"],
                pre_process=first,
                post_process=last,
                share_embeddings_and_output_weights=True,
                position_embedding_type=case["position_embedding_type"],
            )
            # Trained weights are not their initial values: perturb every parameter
            # (biases and norms included, which start at 0 and 1), so that a mapping that
            # mixes them up shows in the logits; a TP shard by its own noise, a tensor
            # that TP ranks replicate (norms, row-parallel biases) by the same on each.
            tp_rank = parallel_state.get_tensor_model_parallel_rank()
            pp_rank = parallel_state.get_pipeline_model_parallel_rank()
            with torch.no_grad():
                for i, p in enumerate(model.parameters()):
                    if getattr(p, "shared_embedding", False):
                        continue
                    sharded = getattr(p, "tensor_model_parallel", False)
                    gen = torch.Generator().manual_seed(
                        1000 * i + 10 * pp_rank + (1 + tp_rank if sharded else 0)
                    )
                    p.add_(torch.randn(p.shape, generator=gen) * 0.05)
                if pp > 1 and (first or last):  # the tied copies stay equal, as in training
                    weight = model.shared_embedding_or_output_weight()
                    dist.all_reduce(weight.data, group=parallel_state.get_embedding_group())
                    weight.data /= 2
            model.eval()
            state = {
                "args": argparse.Namespace(
                    tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
                ),  # fmt: skip
                "checkpoint_version": 3.0,
                "iteration": case.get("iteration", 1),
                "model": model.sharded_state_dict(),
            }
            os.makedirs(case["save"], exist_ok=True)
            dist.barrier()
            dist_checkpointing.save(state, case["save"])
            # The legacy format (--ckpt-format torch) as Megatron-LM's save_checkpoint
            # writes it: each (TP, PP) rank its own state dict, in mp_rank_TT[_PPP].
            shard = f"mp_rank_{tp_rank:02d}" + (f"_{pp_rank:03d}" if pp > 1 else "")
            os.makedirs(os.path.join(case["legacy"], shard))
            torch.save(
                {"iteration": state["iteration"], "checkpoint_version": 3.0,
                 "model": model.state_dict_for_save_checkpoint()},
                os.path.join(case["legacy"], shard, "model_optim_rng.pt"),
            )  # fmt: skip
            tokens = torch.tensor(case["tokens"])
            batch, seq = tokens.shape
            positions = torch.arange(seq).unsqueeze(0).expand(batch, seq)
            mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool)).logical_not()[None, None]
            with torch.no_grad():
                if not first:  # the previous stage's hidden states, [s, b, h]
                    hidden = torch.empty(seq, batch, config.hidden_size)
                    dist.recv(hidden, parallel_state.get_pipeline_model_parallel_prev_rank())
                    model.set_input_tensor(hidden)
                out = model(tokens, positions, mask)
                if not last:
                    dist.send(out.contiguous(),
                              parallel_state.get_pipeline_model_parallel_next_rank())  # fmt: skip
                else:  # [b, s, V/tp] on each TP rank: gather the vocabulary shards
                    parts = [torch.empty_like(out) for _ in range(tp)]
                    dist.all_gather(parts, out.contiguous(),
                                    group=parallel_state.get_tensor_model_parallel_group())  # fmt: skip
                    if parallel_state.get_tensor_model_parallel_rank() == 0:
                        torch.save(torch.cat(parts, dim=-1), case["logits"])
        dist.barrier()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
