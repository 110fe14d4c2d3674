"""Encode speed of the tokenizers users bring (issue 22, item 6): non-BPE models and BPE
without GPT-2 files, HF ``tokenizers`` against gigatoken where gigatoken loads the model.

Trains, with HF ``tokenizers`` on the shipped sample text (resources/sample_text: English
and 18 languages, about 3 MB), four real tokenizers saved as ``tokenizer.json``:
- ``unigram``: SentencePiece-style Unigram (NFKC, Metaspace), as many European models;
- ``wordpiece``: BERT-style WordPiece;
- ``sp_bpe``: SentencePiece-style BPE with byte fallback (Metaspace, as Llama 2 / Mistral);
- ``bytelevel``: byte-level BPE (GPT-2 pre-tokenizer), the reference case.
Then encodes the whole corpus in memory with HF ``encode_batch_fast`` and, where it loads
the tokenizer, with gigatoken (``encode_batch``), checks the ids are equal, and prints
tokens/s and MB/s (median of --repeat runs) and the machine's load before and after.
Also the tokenize stage (``tokenize_shard``: JSONL.zst in, .bin/.idx out, encoder auto)
on the same text, to show which encoder it picks by itself.

Usage: python benchmarks/tokenizer_models.py [--vocab 8000] [--repeat 3] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def sample_texts() -> list[str]:
    from hpcllm.text.tokenization import read_texts

    texts = []
    for name in ("en", "multilingual"):
        for batch in read_texts(REPO / "resources/sample_text" / f"{name}.jsonl.zst", 1 << 20):
            texts.extend(batch)
    return texts


def train(kind: str, texts: list[str], vocab: int):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab,
            special_tokens=["<unk>", "<s>", "</s>"],
            unk_token="<unk>",
            show_progress=False,
        )
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer()
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab, special_tokens=["[UNK]", "[SEP]"], show_progress=False
        )
    elif kind == "sp_bpe":
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
        bytes_ = [f"<0x{i:02X}>" for i in range(256)]
        trainer = trainers.BpeTrainer(
            vocab_size=vocab,
            special_tokens=["<unk>", "<s>", "</s>", *bytes_],
            show_progress=False,
        )
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


EOD = {"unigram": "</s>", "wordpiece": "[SEP]", "sp_bpe": "</s>", "bytelevel": "<|endoftext|>"}


def timed(encode, texts, repeat: int) -> tuple[float, list]:
    runs, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = encode(texts)
        runs.append(time.perf_counter() - start)
    return statistics.median(runs), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--vocab", type=int, default=8000, help="vocabulary size of the trained tokenizers"
    )
    ap.add_argument(
        "--repeat", type=int, default=3, help="rounds per figure; the median is printed"
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count(),
        help="encoder threads (default: the cores of this machine)",
    )
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before tokenizers starts its pool

    import numpy as np

    from hpcllm.text.sample_corpus import write_jsonl_zst
    from hpcllm.text.tokenization import gigatoken_encoder, hf_encoder, tokenize_shard

    texts = sample_texts()
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print(f"corpus: {len(texts)} documents, {mb:.2f} MB; {args.threads} threads; "
          f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
    print(f"{'tokenizer':<10} {'encoder':<9} {'tokens':>9} {'s':>7} {'M tok/s':>8} "
          f"{'MB/s':>6} {'x HF':>5}  note")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        shard = Path(tmp) / "corpus.jsonl.zst"
        write_jsonl_zst(((str(i), t) for i, t in enumerate(texts)), shard)
        for kind in ("unigram", "wordpiece", "sp_bpe", "bytelevel"):
            t0 = time.perf_counter()
            tok = train(kind, texts, args.vocab)
            trained = time.perf_counter() - t0
            hf = hf_encoder(tok)
            hf_s, (flat, lengths) = timed(hf.encode, texts, args.repeat)
            tokens = len(flat)
            note = f"{type(tok.model).__name__}, trained in {trained:.0f} s"
            print(f"{kind:<10} {'hf':<9} {tokens:>9} {hf_s:>7.3f} {tokens / hf_s / 1e6:>8.2f} "
                  f"{mb / hf_s:>6.1f} {1:>5.2f}  {note}")  # fmt: skip
            try:
                gt = gigatoken_encoder(tok)
            except Exception as e:  # gigatoken says which models it supports
                reason = str(e).splitlines()[0]
                print(f"{kind:<10} {'gigatoken':<9} {'-':>9} {'-':>7} {'-':>8} {'-':>6} "
                      f"{'-':>5}  does not load it: {reason}")  # fmt: skip
            else:
                gt_s, (gflat, glengths) = timed(gt.encode, texts, args.repeat)
                same = np.array_equal(gflat, flat) and np.array_equal(glengths, lengths)
                print(f"{kind:<10} {'gigatoken':<9} {len(gflat):>9} {gt_s:>7.3f} "
                      f"{len(gflat) / gt_s / 1e6:>8.2f} {mb / gt_s:>6.1f} {hf_s / gt_s:>5.2f}  "
                      f"ids {'equal to' if same else 'DIFFER from'} HF's")  # fmt: skip
            stats = tokenize_shard(shard, Path(tmp) / f"{kind}_text_document", tok, EOD[kind])
            print(f"{kind:<10} {'stage':<9} {stats.tokens:>9} {stats.seconds:>7.3f} "
                  f"{stats.tokens / stats.seconds / 1e6:>8.2f} {mb / stats.seconds:>6.1f} "
                  f"{hf_s / stats.seconds:>5.2f}  tokenize_shard picked {stats.encoder} "
                  "(JSONL.zst in, .bin/.idx out, EOD appended)")  # fmt: skip
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
