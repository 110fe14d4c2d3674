"""Small corpora and tokenizers for the text-pipeline tests."""

from __future__ import annotations

from pathlib import Path

import pytest

# Many scripts and the edge cases byte-level BPE must get right.
EDGE_TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Größenverhältnisse in Baden-Württemberg: Straße, Maß, Fuß.",
    "L'été dernier, nous étions à Besançon ; où êtes-vous ?",
    "Ελληνικά: Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
    "Русский текст: съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Polski: Zażółć gęślą jaźń. Čeština: Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "日本語の文章です。東京は日本の首都です。漢字、ひらがな、カタカナ。",
    "中文文本：我们今天去公园散步。한국어 문장도 있습니다.",
    "العربية: مرحبا بالعالم. עברית: שלום עולם.",
    "Emoji 🚀🔥 and flags 🇪🇺🇩🇪, ZWJ 👨‍👩‍👧‍👦, skin tone 👍🏽.",
    "Combining: e\u0301 a\u0308 o\u0302; NBSP:\u00a0here; zero width:\u200bthere.",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\nand\u2028line separators",
    "Code: def f(x):\n    return x ** 2  # comment\n\nif __name__ == '__main__': f(3)",
    "Numbers 1234567890 3.14159 1e-10 0xDEADBEEF 2026-11-21T10:00:00Z",
    "a" * 3000,
    "word " * 500,
    "<|endoftext|> appears literally inside text",
    "Control \x01\x02 chars and \x7f delete",
    "Mixed: Ünïcödé ⅓ ½ ™ © ® ∑ ∫ √ ∞ ≠ ≤ ≥ → ← ↑ ↓",
]


@pytest.fixture(scope="session")
def edge_texts() -> list[str]:
    return list(EDGE_TEXTS)


@pytest.fixture(scope="session")
def sample_texts(repo: Path) -> list[str]:
    from hpcllm.text.tokenization import read_texts

    texts: list[str] = []
    for name in ("en", "multilingual"):
        for batch in read_texts(repo / "resources" / "sample_text" / f"{name}.jsonl.zst", 1 << 20):
            texts.extend(batch)
    return texts


@pytest.fixture(scope="session")
def trained_tokenizer(tmp_path_factory, sample_texts) -> Path:
    """A small byte-level BPE trained on the shipped sample corpus."""
    from hpcllm.text.sample_corpus import write_jsonl_zst
    from hpcllm.text.tokenizer_train import train_bpe

    d = tmp_path_factory.mktemp("tok")
    shard = d / "corpus.jsonl.zst"
    write_jsonl_zst(((str(i), t) for i, t in enumerate(sample_texts)), shard)
    train_bpe([shard], d / "bpe", vocab_size=2000, special_tokens=["<|endoftext|>"])
    return d / "bpe" / "tokenizer.json"
