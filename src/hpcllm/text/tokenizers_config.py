"""Tokenizers as the config describes them: trained here, or existing files."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from hpcllm.atomic import atomic_paths
from hpcllm.text.tokenization import (
    TokenizerError,
    check_tokenizer,
    load_tokenizer,
    special_tokens_of,
    tokenizer_from_gpt2_files,
)

# Special tokens that usually end a document (</s>, <|endoftext|>, <eos>, [SEP]): the one a
# plan-time message suggests for eod_token.
_END = re.compile(r"</s>|end|eos|sep", re.IGNORECASE)


def tokenizer_files(name: str, cfg: dict[str, Any]) -> list[str]:
    """The files tokenize loads a tokenizer from (inputs of the rules that use it):
    ``tokenizer_json`` wins over GPT-2 files named beside it."""
    if cfg["type"] == "train":
        return [f"data/tokenizers/{name}/tokenizer.json"]
    if cfg.get("tokenizer_json"):
        return [cfg["tokenizer_json"]]
    return [cfg["vocab_file"], cfg["merges_file"]]


def retrain_warning(
    name: str,
    cfg: dict[str, Any],
    sources: Iterable[str],
    shards_of: Callable[[str], list[str]],
    exists: Callable[[str], bool] = os.path.exists,
) -> str | None:
    """Why a trained tokenizer that trains on every source will be trained again: a source
    with no shard yet (one just added) is new training data. Snakemake says only "Set of
    input files has changed"; this names the sources and the pin that keeps the tokenizer.
    """
    if cfg["type"] != "train" or cfg.get("sources"):
        return None
    if not exists(f"data/tokenizers/{name}/tokenizer.json"):
        return None
    sources = list(sources)
    new = [s for s in sources if not any(exists(p) for p in shards_of(s))]
    if not new:
        return None
    old = [s for s in sources if s not in new]
    return (
        f"text.tokenizers.{name} trains on every source (it has no sources:), and "
        f"{', '.join(new)} {'is' if len(new) == 1 else 'are'} new (no shard tokenized yet): "
        f"{name} will be trained again, every dataset tokenized with it made again, and the "
        "training runs and benchmarks that read them rerun. To keep the trained tokenizer, "
        f"pin the sources it was trained on: text.tokenizers.{name}.sources: "
        f"[{', '.join(old)}] (in your --configfile)"
    )


def hf_folder(name: str) -> str:
    """The folder the engines read a given (``type: files``) tokenizer from (rule
    ``tokenizer_folder``): its ``tokenizer.json`` (a copy of ``tokenizer_json``, or the
    one built from GPT-2 ``vocab_file`` and ``merges_file``) and a
    ``tokenizer_config.json`` naming the end-of-document token as ``eos_token``."""
    return f"data/tokenizers/{name}/hf"


def engine_files(name: str, cfg: dict[str, Any]) -> tuple[str, str]:
    """The two files the training engines and the index cache read for a tokenizer.

    Trained ones: ``train_tokenizer``'s GPT-2 style ``vocab.json`` and ``merges.txt``
    (their folder also holds the tokenizer.json and tokenizer_config.json Megatron's
    HuggingFaceTokenizer reads). Given ones: ``tokenizer.json`` and
    ``tokenizer_config.json`` of :func:`hf_folder`, made from exactly the files the config
    names (``tokenizer_json`` wins over ``vocab_file``/``merges_file`` given beside it).
    So Megatron always reads a folder with HuggingFaceTokenizer, offline: never
    GPT2BPETokenizer, which at the pin is ``AutoTokenizer.from_pretrained("gpt2", ...)``
    and takes a gpt2 snapshot in HF_HOME over the given files."""
    if cfg.get("type", "train") == "train":
        return f"data/tokenizers/{name}/vocab.json", f"data/tokenizers/{name}/merges.txt"
    folder = hf_folder(name)
    return f"{folder}/tokenizer.json", f"{folder}/tokenizer_config.json"


def is_hf_folder(files: tuple[str, str] | list[str]) -> bool:
    """Whether :func:`engine_files` named a Hugging Face folder (tokenizer.json and
    tokenizer_config.json) rather than GPT-2 style vocab and merges files."""
    return len(files) == 2 and [Path(f).name for f in files] == [
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def engine_vocabulary(files: tuple[str, str] | list[str], eod_token: str) -> tuple[int, int]:
    """(vocabulary size, end-of-document id) of :func:`engine_files` as the engines see
    them: for a Hugging Face folder Megatron's HuggingFaceTokenizer's ``len(tokenizer)``
    (every token, added ones included) and the id of its ``eos_token``; for GPT-2 files
    the largest id of ``vocab.json`` plus one and the id of ``eod_token``."""
    if is_hf_folder(files):
        tok = load_tokenizer(files[0])
        eod = tok.token_to_id(eod_token)
        if eod is None:
            raise TokenizerError(
                f"{files[0]}: has no end-of-document token {eod_token!r}; set the "
                "tokenizer's eod_token to one of its special tokens "
                f"({', '.join(special_tokens_of(tok)) or 'it has none'})"
            )
        try:
            eos = json.loads(Path(files[1]).read_text()).get("eos_token")
        except (OSError, ValueError, AttributeError) as e:
            raise TokenizerError(
                f"{files[1]}: not a readable tokenizer_config.json ({e})"
            ) from None
        if eos != eod_token:
            # Megatron's EOD is the eos_token: it must be the token the data ends documents with
            raise TokenizerError(
                f"{files[1]}: names eos_token {eos!r}, but the documents end with "
                f"{eod_token!r}; delete the folder and rerun (rule tokenizer_folder writes it)"
            )
        return tok.get_vocab_size(with_added_tokens=True), eod
    try:
        vocab = json.loads(Path(files[0]).read_text())
    except (OSError, ValueError) as e:
        raise TokenizerError(f"{files[0]}: not a readable vocab.json ({e})") from None
    if eod_token not in vocab:
        raise TokenizerError(f"{files[0]}: has no end-of-document token {eod_token!r}")
    return max(vocab.values()) + 1, vocab[eod_token]


def write_hf_folder(
    cfg: dict[str, Any], files: str | list[str], out_dir: str | os.PathLike
) -> Path:
    """Write :func:`hf_folder` from a given tokenizer's ``files`` (:func:`tokenizer_files`):
    its ``tokenizer.json`` (a copy of a given one; for GPT-2 vocab and merges files, the
    tokenizer tokenize encodes with, saved) checked as tokenize checks it (``tokenizers``
    loads it, it has the end-of-document token and, when the config says, ``vocab_size``
    tokens), and a ``tokenizer_config.json`` naming ``eod_token`` as ``eos_token``, which
    Megatron's HuggingFaceTokenizer takes its EOD id from (AutoTokenizer reads the folder
    offline as a PreTrainedTokenizerFast whatever the model: BPE, Unigram, WordPiece)."""
    from hpcllm.text.tokenizer_train import hf_tokenizer_config

    files = [files] if isinstance(files, str) else list(files)
    tokenizer = tokenizer_for(cfg, files)
    out = Path(out_dir)
    with atomic_paths(out / "tokenizer.json", out / "tokenizer_config.json") as (tok, config):
        if len(files) == 1:
            shutil.copyfile(files[0], tok)
        else:
            tokenizer.save(str(tok))
        config.write_text(json.dumps(hf_tokenizer_config(cfg["eod_token"]), indent=2) + "\n")
    return out


def plan_problem(name: str, cfg: dict[str, Any], exists: Callable[[str], bool] = os.path.exists):
    """At plan time: what keeps a tokenizer's end-of-document token from being found, as
    a message naming the key and what to set; None if nothing does (or its files are not
    there yet: the job that reads them checks again)."""
    where = f"text.tokenizers.{name}"
    eod = cfg.get("eod_token", "<|endoftext|>")
    if cfg.get("type", "train") == "train":
        specials = cfg.get("special_tokens") or []
        if eod not in specials:
            return (
                f"{where}: the end-of-document token eod_token {eod!r} is not one of its "
                f"special_tokens ({', '.join(specials) or 'none'}), so the trained tokenizer "
                f"would not have it; add it to {where}.special_tokens (first) or set "
                f"{where}.eod_token to one of them"
            )
        return None
    if cfg.get("tokenizer_json"):
        path = cfg["tokenizer_json"]
        if not exists(path):
            return None
        try:
            tok = load_tokenizer(path)
        except TokenizerError as e:
            return f"{where}.tokenizer_json: {e}"
        if tok.token_to_id(eod) is None:
            specials = special_tokens_of(tok)
            ends = [t for t in specials if _END.search(t)]
            return (
                f"{where}: the end-of-document token eod_token {eod!r} is not in "
                f"{path} ({type(tok.model).__name__}, special tokens: "
                f"{', '.join(specials) or 'none'}); set {where}.eod_token to its "
                "end-of-document token" + (f" (e.g. eod_token: {ends[0]!r})" if ends else "")
            )
        if cfg.get("vocab_file") and exists(cfg["vocab_file"]):
            return _vocab_disagreement(where, tok, path, cfg["vocab_file"])
        return None
    vocab_file = cfg["vocab_file"]
    if not exists(vocab_file):
        return None
    try:
        vocab = json.loads(Path(vocab_file).read_text())
    except (OSError, ValueError) as e:
        return f"{where}.vocab_file: {vocab_file} is not a readable vocab.json ({e})"
    if eod not in vocab:
        return (
            f"{where}: the end-of-document token eod_token {eod!r} is not in {vocab_file}; "
            f"set {where}.eod_token to its end-of-document token"
        )
    return None


_GIVEN_FILES = {
    "tokenizer_json": "a Hugging Face tokenizer.json",
    "vocab_file": "a GPT-2 style vocab.json",
    "merges_file": "a GPT-2 style merges.txt",
}


def missing_file_problem(
    name: str, cfg: dict[str, Any], exists: Callable[[str], bool] = os.path.exists
) -> str | None:
    """At plan time: a given tokenizer's file that is not there, named by its key (else
    Snakemake names only the path, as a missing input of tokenize). A path under the
    folders the workflow writes (``data/``, ...) may be made by one of its rules: the
    rule that reads it waits for it, or Snakemake says no rule makes it."""
    from hpcllm.commandline import OUTPUT_FOLDERS

    if cfg.get("type", "train") == "train":
        return None
    keys = ["tokenizer_json"] if cfg.get("tokenizer_json") else ["vocab_file", "merges_file"]
    for key in keys:
        path = cfg.get(key)
        if not path or exists(path):
            continue
        inside = os.path.relpath(os.path.abspath(path)).split(os.sep)[0]
        if inside in OUTPUT_FOLDERS:
            continue
        return (
            f"text.tokenizers.{name}.{key}: {path} does not exist (a relative path is read "
            f"from the working directory, {os.getcwd()}); set it to the path of "
            f"{_GIVEN_FILES[key]}"
        )
    return None


def _vocab_disagreement(where: str, tok, tokenizer_json: str, vocab_file: str) -> str | None:
    """vocab_file and merges_file given beside tokenizer_json must describe the same
    tokenizer (tokenizer_json wins everywhere): every token of vocab_file has its id there."""
    try:
        vocab = json.loads(Path(vocab_file).read_text())
    except (OSError, ValueError) as e:
        return f"{where}.vocab_file: {vocab_file} is not a readable vocab.json ({e})"
    ids = tok.get_vocab(with_added_tokens=True)
    wrong = [t for t, i in vocab.items() if ids.get(t) != i]
    if not wrong:
        return None
    return (
        f"{where}: vocab_file {vocab_file} and tokenizer_json {tokenizer_json} disagree "
        f"({len(wrong)} of {len(vocab)} tokens, e.g. {wrong[0]!r}: {vocab[wrong[0]]} against "
        f"{ids.get(wrong[0])}); tokenizer_json is what tokenize and the engines read, so "
        "drop vocab_file and merges_file or point them at that tokenizer's files"
    )


def tokenizer_for(cfg: dict[str, Any], files: list[str] | str):
    """Load a tokenizer from its files, checked against the configured vocabulary.

    A trained tokenizer is checked for its end-of-document token only (a small corpus
    can give fewer tokens than ``vocab_size`` asked for); given files are checked
    against ``vocab_size`` too when the config sets it.
    """
    files = [files] if isinstance(files, str) else list(files)
    vocab_size = cfg.get("vocab_size") if cfg["type"] == "files" else None
    if len(files) == 1:
        return load_tokenizer(files[0], vocab_size, cfg["eod_token"])
    tok = check_tokenizer(
        tokenizer_from_gpt2_files(files[0], files[1]), files[0], vocab_size, cfg["eod_token"]
    )
    # As in tokenizer.json (and HF's GPT-2 tokenizer), the end-of-document token is special:
    # its literal text in a document maps to its id, so both forms give the same ids.
    tok.add_special_tokens([cfg["eod_token"]])
    return tok
