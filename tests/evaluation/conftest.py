"""A tiny exported model (what the export stage writes) and a tiny tokenized dataset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import REPO

TASKS_DIR = REPO / "resources" / "eval_tasks"


def texts() -> list[str]:
    lines = (TASKS_DIR / "module_purpose.jsonl").read_text().splitlines()
    return [" ".join([json.loads(x)["module"], *json.loads(x)["choices"]]) for x in lines]


@pytest.fixture(scope="session")
def export_record(tmp_path_factory) -> Path:
    """results/export/<exp>/iter_<N>/export.json beside a Hugging Face Llama folder with
    its tokenizer, as the export stage leaves them (a byte-level BPE of 300 tokens)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder = tmp_path_factory.mktemp("export") / "results/export/tiny/iter_0000030"
    folder.mkdir(parents=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(texts(), trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    (folder / "export.json").write_text(json.dumps({"experiment": "tiny", "iteration": 30}))
    return folder / "export.json"


@pytest.fixture(scope="session")
def tokenized(tmp_path_factory, export_record) -> tuple[str, list[np.ndarray]]:
    """A .bin/.idx dataset of the sample texts with the export's tokenizer: its prefix
    and its documents."""
    import transformers

    from hpcllm.text.indexed_dataset import IndexedDatasetWriter

    tok = transformers.AutoTokenizer.from_pretrained(export_record.parent)
    docs = [np.array(tok(t)["input_ids"] + [tok.eos_token_id], dtype=np.uint16) for t in texts()]
    prefix = str(tmp_path_factory.mktemp("data") / "sample_text_document")
    with IndexedDatasetWriter(prefix, np.dtype(np.uint16)) as writer:
        for doc in docs:
            writer.add_document(doc)
    return prefix, docs
