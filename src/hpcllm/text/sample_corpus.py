"""Build text corpora offline from documentation every Debian machine carries.

English: Python's standard library documentation (pydoc), the man pages and
``/usr/share/doc``. Other languages: the translated man pages under
``/usr/share/man/<lang>/``. Used to make the shipped sample corpus
(``resources/sample_text``, see ``python -m hpcllm sample-corpus``) and the benchmark
corpora of any size.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import zstandard

from hpcllm.atomic import atomic_path

MAN_ROOT = Path("/usr/share/man")
DOC_ROOT = Path("/usr/share/doc")
# European languages first (the seed project trains multilingual European models),
# then other scripts so the tokenizer meets Cyrillic, Greek and CJK text too.
LANGUAGES = (
    "de",
    "fr",
    "es",
    "it",
    "pl",
    "nl",
    "pt",
    "sv",
    "fi",
    "cs",
    "hu",
    "da",
    "ro",
    "uk",
    "ru",
    "el",
    "ja",
    "zh_CN",
    "ko",
)
PYDOC_MODULES = (
    "abc argparse array ast asyncio base64 bisect calendar cmath collections colorsys "
    "concurrent.futures configparser contextlib copy csv dataclasses datetime decimal "
    "difflib email enum fnmatch fractions functools getopt gettext glob graphlib gzip "
    "hashlib heapq hmac html html.parser http.client http.server imaplib inspect io "
    "ipaddress itertools json keyword linecache locale logging lzma mailbox math "
    "mimetypes multiprocessing numbers operator os os.path pathlib pickle platform "
    "plistlib pprint queue random re sched secrets selectors shelve shlex shutil signal "
    "smtplib socket socketserver sqlite3 ssl stat statistics string struct subprocess "
    "tarfile tempfile textwrap threading time timeit tokenize traceback types typing "
    "unicodedata unittest urllib.parse urllib.request uuid warnings weakref xml.dom "
    "xml.etree.ElementTree zipfile zlib"
).split()

_ROFF_ESCAPES = re.compile(r"\\f(\[[^\]]*\]|\(..|.)|\\\*(\[[^\]]*\]|\(..|.)|\\\(..|\\[&|^%]")


def strip_roff(source: str) -> str:
    """Roughly plain text from roff source: drop requests and font escapes."""
    lines = []
    for line in source.splitlines():
        if line.startswith((".", "'")):
            words = line.split(None, 1)
            # Keep the text of headings and font macros (.SH NAME, .B word).
            if len(words) == 2 and words[0] in (".SH", ".SS", ".B", ".I", ".BR", ".IR", ".TP"):
                lines.append(words[1].replace('"', ""))
            continue
        lines.append(line)
    text = _ROFF_ESCAPES.sub("", "\n".join(lines))
    text = text.replace("\\-", "-").replace("\\e", "\\").replace("\\ ", " ")
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def man_documents(lang: str | None = None) -> Iterator[tuple[str, str]]:
    root = MAN_ROOT / lang if lang else MAN_ROOT
    for path in sorted(root.glob("man[0-9]*/*.gz")):
        try:
            text = strip_roff(gzip.decompress(path.read_bytes()).decode("utf-8"))
        except (OSError, UnicodeDecodeError, EOFError):
            continue
        if len(text) > 200:
            yield f"man/{lang or 'en'}/{path.name.removesuffix('.gz')}", text


def pydoc_documents() -> Iterator[tuple[str, str]]:
    import importlib
    import pydoc

    for name in PYDOC_MODULES:
        try:
            module = importlib.import_module(name)
            text = pydoc.render_doc(module, renderer=pydoc.plaintext)
        except Exception:  # a module missing on this Python: skip it
            continue
        yield f"pydoc/{name}", text


def doc_documents() -> Iterator[tuple[str, str]]:
    for path in sorted(DOC_ROOT.glob("*/*")):
        if path.name not in ("copyright", "changelog.Debian.gz", "NEWS.Debian.gz", "README.Debian"):
            continue
        try:
            raw = path.read_bytes()
            text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError):
            continue
        yield f"doc/{path.parent.name}/{path.name}", text


def english_documents() -> Iterator[tuple[str, str]]:
    yield from pydoc_documents()
    yield from man_documents()
    yield from doc_documents()


def take_bytes(
    docs: Iterator[tuple[str, str]], target: int, repeat: bool = True
) -> Iterator[tuple[str, str]]:
    """Documents until ``target`` bytes; with ``repeat``, passes again if short.

    Later passes mark their ids and perturb the text (a pass number glued to every
    seventh word), so that a corpus made larger this way still has words an encoder's
    cache has not seen: memory measured on it is not flattered by repetition.
    """
    total, rounds = 0, 0
    while total < target:
        seen = 0
        for doc_id, text in docs() if callable(docs) else docs:
            if rounds:
                doc_id, text = f"{doc_id}#{rounds}", _perturb(text, rounds)
            yield doc_id, text
            total += len(text.encode("utf-8"))
            seen += 1
            if total >= target:
                return
        rounds += 1
        if not repeat or not callable(docs) or seen == 0:
            return


def _perturb(text: str, rounds: int) -> str:
    words = text.split(" ")
    words[::7] = [f"{w}{rounds}" for w in words[::7]]
    return " ".join(words)


def write_jsonl_zst(docs: Iterator[tuple[str, str]], path: str | os.PathLike) -> int:
    n = 0
    with atomic_path(path) as tmp, open(tmp, "wb") as raw:
        with zstandard.ZstdCompressor(level=10).stream_writer(raw, closefd=False) as out:
            for doc_id, text in docs:
                out.write(orjson.dumps({"id": doc_id, "text": text}) + b"\n")
                n += 1
    return n


def multilingual_documents(per_language_bytes: int) -> Iterator[tuple[str, str]]:
    for lang in LANGUAGES:
        yield from take_bytes(man_documents(lang), per_language_bytes, repeat=False)


def build_sample_corpus(
    out_dir: str | os.PathLike, english_bytes: int = 1_500_000, per_language_bytes: int = 100_000
) -> None:
    """Write ``en.jsonl.zst`` and ``multilingual.jsonl.zst`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n_en = write_jsonl_zst(take_bytes(english_documents, english_bytes), out / "en.jsonl.zst")
    n_ml = write_jsonl_zst(
        multilingual_documents(per_language_bytes), out / "multilingual.jsonl.zst"
    )
    print(f"{out}: {n_en} English and {n_ml} multilingual documents", file=sys.stderr)


def write_hub_mirror(
    docs: list[tuple[str, str]],
    root: str | os.PathLike,
    config_name: str = "sample-10BT",
    data_dir: str = "sample/10BT",
    files: int = 2,
) -> Path:
    """A local copy of a FineWeb-like hub repository: README configs plus Parquet files.

    This is what ``hf download HuggingFaceFW/fineweb --repo-type dataset --local-dir``
    leaves for one config; ``datasets.load_dataset(root, name=config_name)`` reads it.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(root)
    (root / data_dir).mkdir(parents=True, exist_ok=True)
    per_file = -(-len(docs) // files)
    for i in range(files):
        part = docs[i * per_file : (i + 1) * per_file]
        table = pa.table(
            {
                "text": [t for _, t in part],
                "id": [d for d, _ in part],
                "dump": ["CC-MAIN-2024-10"] * len(part),
            }
        )
        pq.write_table(table, root / data_dir / f"{i:03d}_00000.parquet")
    readme = io.StringIO()
    readme.write("---\nconfigs:\n")
    readme.write(f"- config_name: {config_name}\n  data_files:\n  - split: train\n")
    readme.write(f"    path: {data_dir}/*.parquet\n---\n# A local mirror of a hub dataset\n")
    (root / "README.md").write_text(readme.getvalue())
    return root


def write_oscar_mirror(
    docs: list[tuple[str, str]],
    root: str | os.PathLike,
    lang: str = "de",
    parts: int = 3,
) -> Path:
    """A local copy shaped like ``oscar-corpus/OSCAR-2301`` for one language.

    Like the real repository: a loading script ``OSCAR-2301.py`` at the top (which
    ``datasets`` 4 and later refuse to run), and per language ``<lang>_meta/`` holding
    ``<lang>_meta_part_<n>.jsonl.zst`` (n from 1) listed in ``checksum.sha256``, one
    record per line with the text under ``content`` next to ``warc_headers`` and
    ``metadata``.
    """
    import hashlib

    root = Path(root)
    folder = root / f"{lang}_meta"
    folder.mkdir(parents=True, exist_ok=True)
    (root / "OSCAR-2301.py").write_text(
        '"""OSCAR-2301 loading script (stand-in: datasets >= 4 refuses to run scripts)."""\n'
        "import datasets\n\n\nclass Oscar2301(datasets.GeneratorBasedBuilder):\n"
        "    pass\n"
    )
    (root / "README.md").write_text(
        "---\nextra_gated_prompt: accept the terms of use\n---\n# OSCAR-2301 (local mirror)\n"
    )
    per_part = -(-len(docs) // parts)
    sums = []
    for n in range(1, parts + 1):
        name = f"{lang}_meta_part_{n}.jsonl.zst"
        lines = []
        for i, (doc_id, text) in enumerate(docs[(n - 1) * per_part : n * per_part]):
            record = {
                "content": text,
                "warc_headers": {
                    "warc-record-id": f"<urn:uuid:{doc_id}>",
                    "warc-date": "2023-01-29T12:00:00Z",
                    "content-type": "text/plain",
                    "content-length": str(len(text.encode())),
                    "warc-type": "conversion",
                },
                "metadata": {
                    "identification": {"label": lang, "prob": 0.99},
                    "harmful_pp": 100.0 + i,
                    "tlsh": None,
                    "quality_warnings": None,
                    "categories": None,
                    "sentence_identifications": [{"label": lang, "prob": 0.98}],
                },
            }
            lines.append(orjson.dumps(record))
        data = zstandard.ZstdCompressor(level=3).compress(b"\n".join(lines) + b"\n")
        (folder / name).write_bytes(data)
        sums.append(f"{hashlib.sha256(data).hexdigest()} {name}\n")
    (folder / "checksum.sha256").write_text("".join(sums))
    return root
