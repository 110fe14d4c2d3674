"""The torch engine's checkpoint exported: the folder transformers loads gives the
logits of the engine's own model, resumed with the engine's own checkpoint loader, on
fixed token ids (tolerance: 1e-5 absolute, float32 on the CPU); the tokenizer folder
encodes as the engine's tokenizer; export.json names the checkpoint; settings that
differ from the checkpoint's are refused."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from hpcllm.export.convert import ExportError
from hpcllm.export.folder import export, settings_hash
from hpcllm.export.identity import weights_digest
from hpcllm.models.planner import pad_vocab
from hpcllm.training.checkpoints import tracker as checkpoints
from hpcllm.training.engines.torch_engine import (
    build_model,
    init_distributed,
    load_checkpoint,
    parser,
    train,
)
from hpcllm.training.plan.settings import write_settings

TOLERANCE = 1e-5
EOD = "<|endoftext|>"


def gpt2_tokenizer(folder: Path) -> list[str]:
    """GPT-2 style vocab.json and merges.txt with the end-of-document token, as the
    engines read them, and a trained tokenizer's tokenizer.json beside them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from hpcllm.text.tokenizer_train import hf_tokenizer_config

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[EOD])
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer)
    folder.mkdir(parents=True)
    tok.model.save(str(folder))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(hf_tokenizer_config(EOD)))
    return [str(folder / "vocab.json"), str(folder / "merges.txt")]


def train_tiny(save: Path, vocab_file: str, position: str) -> argparse.Namespace:
    """Two real iterations of the torch engine on Megatron's mock data."""
    argv = [
        "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "2",
        "--train-iters", "2", "--lr", "1e-2", "--mock-data", "--vocab-file", vocab_file,
        "--position-embedding-type", position, "--save", str(save), "--threads", "1",
        "--log-interval", "1", "--eval-iters", "0", "--data-cache-path", str(save / "cache"),
    ]  # fmt: skip
    args = parser().parse_args(argv)
    train(args)
    return args


def weights(engine="torch", position="rope") -> dict:
    return {
        "engine": engine,
        "model.num_attention_heads": 4,
        "model.position_embedding": position,
        "model.seq_length": 16,
        "model.hidden_size": 32,
    }


def record(tmp: Path, iteration: int, samples: int) -> Path:
    path = tmp / "seg1.json"
    path.write_text(
        json.dumps({"segment": 1, "last_iteration": iteration, "consumed_samples": samples})
    )
    return path


@pytest.mark.parametrize("position", ["rope", "learned_absolute"])
def test_torch_engine_export_gives_the_engines_logits(tmp_path, position):
    import transformers

    tokenizer = gpt2_tokenizer(tmp_path / "tok")
    save = tmp_path / "checkpoints"
    args = train_tiny(save, tokenizer[0], position)
    write_settings(save, weights(position=position), {})
    out = tmp_path / "export" / "iter_0000002"
    info = export("tiny", record(tmp_path, 2, 4), save, weights(position=position),
                  tokenizer, EOD, out)  # fmt: skip

    # The source: the engine's model, resumed by the engine's own loader.
    from hpcllm.training.engines.torch_engine import vocabulary

    source = build_model(args, pad_vocab(vocabulary(args)[0], 1, args.make_vocab_size_divisible_by))
    params = list(source.parameters())  # the engine's two groups: with and without decay
    groups = [
        {"params": [p for p in params if p.ndim >= 2]},
        {"params": [p for p in params if p.ndim < 2]},
    ]
    optimizer = torch.optim.AdamW(groups)
    try:  # the engine's own loader, in a one-process group of its own
        load_checkpoint(str(save), source, optimizer, args, init_distributed("cpu"))
    finally:
        torch.distributed.destroy_process_group()
    source.eval()
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert type(exported).__name__ == (
        "LlamaForCausalLM" if position == "rope" else "GPT2LMHeadModel"
    )
    vocab = exported.config.vocab_size
    ids = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = source(input_ids=ids).logits, exported(input_ids=ids).logits
    assert (want - got).abs().max().item() <= TOLERANCE

    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    from tokenizers import Tokenizer

    engine_tok = Tokenizer.from_file(str(Path(tokenizer[0]).parent / "tokenizer.json"))
    text = f"the lazy fox{EOD}jumps"
    assert tok(text)["input_ids"] == engine_tok.encode(text).ids
    assert tok.eos_token == EOD and exported.config.eos_token_id == tok.eos_token_id

    assert json.loads((out / "export.json").read_text()) == info
    assert info["iteration"] == 2 and info["tokens"] == 4 * 16 and info["engine"] == "torch"
    assert info["settings_hash"] == settings_hash(weights(position=position))
    assert info["source_checkpoint"] == str(checkpoints.iteration_dir(save, 2))
    # the weights' digest: that of the checkpoint's checksums manifest (issue 51)
    assert info["weights_digest"] == weights_digest(checkpoints.iteration_dir(save, 2))
    assert len(info["weights_digest"]) == 16


def test_gpt2_files_alone_give_a_tokenizer_folder(tmp_path):
    """Given vocab.json and merges.txt without a tokenizer.json (type: files)."""
    import transformers

    from hpcllm.export.folder import export_tokenizer
    from hpcllm.text.tokenizers_config import tokenizer_for

    files = gpt2_tokenizer(tmp_path / "tok")
    (tmp_path / "tok" / "tokenizer.json").unlink()
    export_tokenizer(files, EOD, tmp_path / "out")
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    engine_tok = tokenizer_for({"type": "files", "eod_token": EOD}, files)
    text = f"the quick dog{EOD}over"
    assert tok(text)["input_ids"] == engine_tok.encode(text).ids


def test_checkpoints_of_other_settings_are_refused(tmp_path):
    save = tmp_path / "checkpoints"
    save.mkdir()
    write_settings(save, {**weights(), "optim.lr": 0.001}, {})
    with pytest.raises(ExportError, match=r"optim\.lr: 0\.001 -> \"unset\""):
        export("tiny", record(tmp_path, 2, 4), save, weights(), [], EOD, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_deleted_checkpoint_says_how_to_keep_it(tmp_path):
    save = tmp_path / "checkpoints"
    save.mkdir()
    write_settings(save, weights(), {})
    with pytest.raises(ExportError, match="keep_checkpoints.every"):
        export("tiny", record(tmp_path, 2, 4), save, weights(), [], EOD, tmp_path / "out")


def test_a_damaged_checkpoint_is_not_exported(tmp_path):
    """A byte flipped in the committed weights (same size, torch loads it): the export
    refuses, naming the file, and writes nothing."""
    tokenizer = gpt2_tokenizer(tmp_path / "tok")
    save = tmp_path / "checkpoints"
    train_tiny(save, tokenizer[0], "rope")
    torch.distributed.destroy_process_group()  # the engine's, left for its caller
    write_settings(save, weights(), {})
    model = checkpoints.model_file(save, 2)
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(
        ExportError, match=f"{model}: damaged.*The export of iteration 2 would convert damaged"
    ):
        export("tiny", record(tmp_path, 2, 4), save, weights(), tokenizer, EOD, tmp_path / "out")
    assert not (tmp_path / "out").exists()
