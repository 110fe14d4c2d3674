"""The export stage: a segment's checkpoint as a Hugging Face model folder.

``results/export/<experiment>/iter_<NNNNNNN>/`` holds what
``transformers.AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained``
load (``config.json``, ``model.safetensors``, the experiment's tokenizer files) and
``export.json``: which checkpoint it came from (experiment, engine, iteration, tokens,
the hash of the weight-determining settings, the checkpoint's path). docs/export.md.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from hpcllm.atomic import atomic_path
from hpcllm.export.convert import ExportError, megatron_tensors, megatron_to_hf, torch_engine_model
from hpcllm.export.identity import weights_digest
from hpcllm.training.checkpoints import tracker as checkpoints
from hpcllm.training.checkpoints.checksums import verify_iteration
from hpcllm.training.checkpoints.tracker import CheckpointError
from hpcllm.training.plan.settings import differences, load_recorded, param_text

log = logging.getLogger(__name__)

INFO = "export.json"
DTYPES = ("checkpoint", "float32", "bfloat16", "float16")


def settings_hash(weights: dict[str, Any]) -> str:
    """A short hash of the weight-determining settings (as the segments' param lists them)."""
    return hashlib.sha256(param_text(weights).encode()).hexdigest()[:16]


def check_settings(experiment: str, save: str | Path, weights: dict[str, Any]) -> None:
    """Refuse checkpoints trained with other weight-determining settings than the
    experiment now has: the export would report a model the config does not describe."""
    recorded = load_recorded(save)
    if recorded is None:
        raise ExportError(
            f"{Path(save) / 'training_settings.json'}: missing, so what the checkpoints of "
            f"{experiment} were trained with is unknown; rerun its training"
        )
    changed = differences(recorded["weights"], weights)
    if changed:
        raise ExportError(
            f"the checkpoints in {save} were trained with other settings than "
            f"training.experiments.{experiment} now has ({'; '.join(changed)}); the "
            "training segments run again first (or restore those settings)"
        )


def export_tokenizer(tokenizer_files: list[str], eod_token: str, out: Path) -> None:
    """The experiment's tokenizer as ``AutoTokenizer`` loads it: a Hugging Face folder
    (given ``tokenizer_json``, or a trained tokenizer's folder, which holds tokenizer.json
    and tokenizer_config.json beside vocab.json and merges.txt) as it is; GPT-2 files
    alone as the engines read them, the end-of-document token its special token."""
    import transformers

    folder = Path(tokenizer_files[0]).parent
    if (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file():
        tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    else:  # the engines' own reading of the two files (hpcllm.text.tokenizers_config)
        from hpcllm.text.tokenization import tokenizer_from_gpt2_files

        engine_tok = tokenizer_from_gpt2_files(*tokenizer_files)
        engine_tok.add_special_tokens([eod_token])
        tok = transformers.PreTrainedTokenizerFast(
            tokenizer_object=engine_tok,
            bos_token=eod_token, eos_token=eod_token, unk_token=eod_token,
        )  # fmt: skip
    if tok.eos_token != eod_token:
        raise ExportError(
            f"{folder}: the tokenizer's eos_token is {tok.eos_token!r}, the documents end "
            f"with {eod_token!r}; rerun the tokenizer_folder rule"
        )
    tok.save_pretrained(str(out))


def build_model(engine: str, iteration_dir: Path, weights: dict[str, Any], eod_id: int):
    if engine == "torch":
        return torch_engine_model(iteration_dir / "mp_rank_00" / "model_optim_rng.pt")
    if engine == "megatron":
        return megatron_to_hf(
            megatron_tensors(iteration_dir),
            heads=weights["model.num_attention_heads"],
            position_embedding=weights["model.position_embedding"],
            max_positions=weights.get("model.max_position_embeddings")
            or weights["model.seq_length"],
            eod_id=eod_id,
        )
    raise ExportError(f"engine {engine!r} has no export")


def export(
    experiment: str,
    record_file: str | Path,
    save: str | Path,
    weights: dict[str, Any],
    tokenizer_files: list[str],
    eod_token: str,
    out: str | Path,
    dtype: str = "checkpoint",
) -> dict[str, Any]:
    """Write the export folder ``out`` of the checkpoint segment ``record_file`` ended
    at (in ``save``), for ``experiment`` with weight-determining settings ``weights``
    (hpcllm.training.plan.settings.weight_settings). Returns export.json's content."""
    import torch

    from hpcllm.text.tokenizers_config import engine_vocabulary

    if dtype not in DTYPES:
        raise ExportError(f"export.dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    record = json.loads(Path(record_file).read_text())
    iteration = record["last_iteration"]
    check_settings(experiment, save, weights)
    source = checkpoints.iteration_dir(save, iteration)
    if not source.is_dir():
        raise ExportError(
            f"{source}: segment {record['segment']} of {experiment} ended at iteration "
            f"{iteration}, but its checkpoint is gone (keep_checkpoints deleted it?). Keep "
            "it with keep_checkpoints.every (a divisor of the segment's iterations) or "
            "rerun that segment"
        )
    try:  # the weights are what was committed (a flipped byte loads without complaint)
        verify_iteration(save, iteration, f"The export of iteration {iteration} would convert")
    except CheckpointError as e:
        raise ExportError(str(e)) from None
    engine = weights["engine"]
    _, eod_id = engine_vocabulary(tokenizer_files, eod_token)
    model = build_model(engine, source, weights, eod_id)
    if dtype != "checkpoint":
        model.to(getattr(torch, dtype))
    model.config.eos_token_id = model.config.bos_token_id = eod_id
    info = {
        "experiment": experiment,
        "engine": engine,
        "iteration": iteration,
        "segment": record["segment"],
        "consumed_samples": record["consumed_samples"],
        "tokens": record["consumed_samples"] * weights["model.seq_length"],
        "settings_hash": settings_hash(weights),
        "source_checkpoint": str(source),
        # the weights (the checkpoint's checksums manifest): names the model, where this
        # file's own digest names the export (hpcllm.export.identity)
        "weights_digest": weights_digest(source),
        # the data the model trained on, as its last segment's record says (None: a record
        # from before records named it)
        "data_digest": record.get("data_digest"),
        "architecture": type(model).__name__,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "export_settings": {"dtype": dtype},
        "exported_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    with atomic_path(out) as tmp:
        model.save_pretrained(str(tmp))
        export_tokenizer(tokenizer_files, eod_token, tmp)
        (tmp / INFO).write_text(json.dumps(info, indent=2) + "\n")
    log.info(
        "exported %s iteration %d as %s to %s", experiment, iteration, info["architecture"], out
    )
    return info
