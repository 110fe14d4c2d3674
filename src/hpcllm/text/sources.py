"""Read raw text documents from configured sources, one deterministic shard at a time.

A source is either a Hugging Face hub dataset (read with ``datasets`` in streaming mode,
from the hub or from a local mirror of the repository) or local files (JSONL, Parquet,
plain text). Every document comes with the place it was read from, so that a bad record
is reported by file and line (or record number).

Sharding keeps source order: shard k gets a contiguous block, so the shards concatenated
(what ``merge_tokenized`` does) are the source in order. When a source has at least as
many files as shards, the blocks are blocks of files (each Slurm job reads only its own
files); otherwise plain JSON lines files are cut into blocks by bytes at line starts
(each job reads only its block), and other files' records are counted and split into
blocks. Limits (documents, bytes) are split evenly over the shards and apply to each
shard's block from its start.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from hpcllm.text.compressed import compression_of, disk_position, open_binary
from hpcllm.text.hub_files import (
    Repository,
    ScriptDataset,
    card_data_files,
    data_files,
    default_text_field,
    loading_script,
    reads_files_directly,
    script_error,
)


class SourceError(ValueError):
    """A source that cannot be read: names the source, file and what to change."""


class BadRecord(ValueError):
    """One record that cannot be used; ``where`` names the file and line or record."""

    def __init__(self, where: str, reason: str, problem: str):
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.reason = reason


@dataclass(frozen=True)
class Document:
    text: str
    id: str
    where: str


@dataclass(frozen=True)
class TextRun:
    """Consecutive rows of a Parquet file's text column kept as one Arrow string array:
    no nulls and valid UTF-8 (checked), so the tokenizer reads its buffers without a
    Python string per document. ``documents()`` gives the same rows one by one."""

    path: str
    first_row: int
    texts: Any  # pyarrow StringArray or LargeStringArray

    def documents(self) -> Iterator[Document]:
        name = Path(self.path).name
        for k, text in enumerate(self.texts.to_pylist()):
            row = self.first_row + k
            yield Document(text, f"{name}#{row}", row_where(self.path, row))


@dataclass
class SkipLog:
    """Counts of skipped records by reason, with the first few places for the manifest."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    max_examples: int = 20

    def add(self, reason: str, message: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if len(self.examples) < self.max_examples:
            self.examples.append(message)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class ShardSize:
    """How much a shard reads, for its progress lines, as its reader learns it before the
    first record: ``records`` where they are known without reading the data (Parquet
    footers, or a block of records counted to split them), else the ``file_bytes`` of its
    files, of which ``bytes_done`` (files read to their end) and ``bytes_now`` (the file
    being read, as JSON lines are read) are read so far."""

    records: int | None = None
    file_bytes: int = 0
    bytes_done: int = 0
    bytes_now: int = 0

    def estimate(self, records_read: int) -> int | None:
        """The shard's records: ``records``, else ``records_read`` (so far) scaled from the
        bytes read to the files' bytes; None before any are read."""
        if self.records is not None:
            return self.records
        read = self.bytes_done + self.bytes_now
        if not (read and records_read and self.file_bytes):
            return None
        return round(records_read * self.file_bytes / read)


# JSON lines between updates of ShardSize.bytes_now (a power of 2: a mask tests it).
POSITION_EVERY = 4096


def row_where(path: str, row: int) -> str:
    """Where row ``row`` (from 0, as pyarrow counts) of a Parquet file is, for a message:
    counted from 1, as JSON lines are (``file:line``), and said so."""
    return f"{path} row {row + 1} (rows counted from 1)"


LOCAL_FORMATS = ("jsonl", "parquet", "text")
UTF8_BOM = b"\xef\xbb\xbf"


def _format_of(path: str) -> str:
    name = path.lower()
    for suffix in (".zst", ".gz", ".xz", ".bz2"):
        name = name.removesuffix(suffix)
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".txt", ".text")):
        return "text"
    raise SourceError(
        f"{path}: cannot tell the file format from its name; set 'format' "
        f"(one of {', '.join(LOCAL_FORMATS)}) in the source's config"
    )


def resolve_local_files(name: str, cfg: dict[str, Any], base: str | os.PathLike = ".") -> list[str]:
    """The sorted list of input files of a local source; an error if any is missing."""
    patterns = cfg.get("files") or []
    if isinstance(patterns, str):
        patterns = [patterns]
    if not patterns:
        raise SourceError(f"text.sources.{name}: a local source needs 'files' (paths or globs)")
    files: list[str] = []
    for pattern in patterns:
        full = os.path.join(base, pattern)
        # A literal path first: '[' and '*' are legal in file names and mean a glob only
        # where no such file exists.
        if os.path.isfile(full):
            files.append(full)
            continue
        matches = sorted(glob.glob(full, recursive=True))
        if not matches:
            raise SourceError(
                f"text.sources.{name}.files: '{pattern}' matches no file (looked in "
                f"{os.path.abspath(base)}); fix the path or create the data first"
            )
        files.extend(m for m in matches if os.path.isfile(m))
    return files


def _jsonl_records(
    path: str,
    text_field: str,
    id_field: str | None,
    size: ShardSize | None = None,
    begin: int = 0,
    end: int | None = None,
) -> Iterator[Document]:
    """JSONL read line by line so that a bad line is reported with its number; ``size``:
    its ``bytes_now`` follows the position in the file. ``begin``/``end`` (an
    uncompressed file only): the lines that start at a byte offset in ``begin``..``end``
    (see :func:`_byte_blocks`), read from the first of them on."""
    if begin or end is not None:
        yield from _jsonl_byte_range(path, text_field, id_field, size, begin, end)
        return
    name = Path(path).name
    mask = POSITION_EVERY - 1 if size is not None else -1  # -1: never 0
    with open_binary(path) as raw:
        for lineno, line in enumerate(raw, 1):
            if not lineno & mask:
                size.bytes_now = disk_position(raw)
            if lineno == 1:
                line = line.removeprefix(UTF8_BOM)  # written by some Windows tools
            if not line.strip():
                continue
            yield _jsonl_line(line, path, name, lineno, text_field, id_field)


def _jsonl_byte_range(
    path: str,
    text_field: str,
    id_field: str | None,
    size: ShardSize | None,
    begin: int,
    end: int | None,
) -> Iterator[Document]:
    """The lines of a plain JSONL file that start at a byte offset in ``begin``..``end``:
    the file is read from the first of them; before it only newlines are counted (in C,
    a few ms per 100 MB) so that lines keep their numbers."""
    name = Path(path).name
    with open(path, "rb") as raw:
        first = 1
        if begin:
            raw.seek(begin - 1)
            raw.readline()  # the rest of the line that starts before ``begin``
        pos = raw.tell()
        if pos:
            first += _newlines_before(path, pos)
        for lineno, line in enumerate(raw, first):
            if end is not None and pos >= end:
                break
            pos += len(line)
            if size is not None and not lineno & (POSITION_EVERY - 1):
                size.bytes_now = pos - begin
            if lineno == 1:
                line = line.removeprefix(UTF8_BOM)
            if not line.strip():
                continue
            yield _jsonl_line(line, path, name, lineno, text_field, id_field)


def _newlines_before(path: str, pos: int, chunk: int = 1 << 24) -> int:
    """The newlines in the first ``pos`` bytes of ``path``, counted in the file's pages
    mapped (numpy over a 16 MiB window at a time): 0.14 CPU-s for 750 MB of text against
    0.26 reading it into chunks and counting there (copying out of the page cache), the
    share of a shard's CPU that grows with the file (issue 51 item 10)."""
    import mmap

    import numpy as np

    with open(path, "rb") as raw:
        size = min(pos, os.fstat(raw.fileno()).st_size)
        if size <= 0:
            return 0
        mapped = mmap.mmap(raw.fileno(), size, prot=mmap.PROT_READ)
    try:
        data = np.frombuffer(mapped, np.uint8, count=size)
        hits = np.empty(min(chunk, size), bool)
        count = 0
        for start in range(0, size, chunk):
            window = data[start : start + chunk]
            np.equal(window, 10, out=hits[: len(window)])  # 10: b"\n"
            count += int(np.count_nonzero(hits[: len(window)]))
        del data, window  # views of the mapping: released before it is closed
        return count
    finally:
        with contextlib.suppress(BufferError):  # a view still held by an error's frame
            mapped.close()


def _jsonl_line(
    line: bytes, path: str, name: str, lineno: int, text_field: str, id_field: str | None
) -> Document | BadRecord:
    try:
        # orjson refuses invalid UTF-8 too: the line is decoded a second time
        # only to tell which of the two it is.
        record = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as bad:
            return BadRecord(
                f"{path}:{lineno}",
                "invalid_utf8",
                f"invalid UTF-8 at byte {bad.start} of the line",
            )
        return BadRecord(f"{path}:{lineno}", "malformed_json", f"malformed JSON ({e})")
    if not isinstance(record, dict):
        return BadRecord(f"{path}:{lineno}", "malformed_json", "a JSON line must hold an object")
    return _document(record, f"{path}:{lineno}", text_field, id_field, f"{name}:{lineno}")


def _document(
    record: dict[str, Any], where: str, text_field: str, id_field: str | None, fallback_id: str
) -> Document | BadRecord:
    if text_field not in record:
        return BadRecord(
            where,
            "missing_text",
            f"no field '{text_field}' (fields: {', '.join(sorted(record)) or 'none'}); "
            "set the source's 'text_field'",
        )
    text = record[text_field]
    if not isinstance(text, str):
        return BadRecord(where, "missing_text", f"field '{text_field}' is not a string")
    doc_id = record.get(id_field) if id_field else None
    return Document(text, str(doc_id) if doc_id is not None else fallback_id, where)


def _datasets_records(
    dataset: Any, label: str, text_field: str, id_field: str | None
) -> Iterator[Document | BadRecord]:
    i = -1
    try:
        for i, record in enumerate(dataset):
            where = f"{label} record {i + 1} (records counted from 1)"
            yield _document(record, where, text_field, id_field, f"{label}#{i}")
    except UnicodeDecodeError as e:
        yield BadRecord(label, "invalid_utf8", f"invalid UTF-8 ({e.reason} at byte {e.start})")
    except (OSError, ValueError) as e:  # pyarrow and datasets errors on a corrupt file
        raise SourceError(f"{label}: cannot read after record {i + 1} ({e})") from e


def _parquet_records(
    path: str,
    text_field: str,
    id_field: str | None,
    start: int = 0,
    stop: int | None = None,
    columnar: bool = False,
) -> Iterator[Document | BadRecord | TextRun]:
    """Rows ``start``..``stop`` of a Parquet file, read with pyarrow in batches of the text
    (and id) column; only the row groups that hold them are read. ``columnar``: clean
    batches come as :class:`TextRun` (the text column only), the others row by row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        raise SourceError(
            f"{path}: truncated or corrupt Parquet file ({e}); download it again"
        ) from None
    names = pf.schema_arrow.names
    stop = pf.metadata.num_rows if stop is None else min(stop, pf.metadata.num_rows)
    if text_field not in names:
        for row in range(start, stop):
            yield BadRecord(
                row_where(path, row),
                "missing_text",
                f"no field '{text_field}' (fields: {', '.join(sorted(names)) or 'none'}); "
                "set the source's 'text_field'",
            )
        return
    columns = [text_field]
    if id_field and id_field in names and not columnar:
        columns.append(id_field)
    offset = 0
    try:
        for rg in range(pf.num_row_groups):
            rows = pf.metadata.row_group(rg).num_rows
            if offset + rows <= start:
                offset += rows
                continue
            if offset >= stop:
                break
            for batch in pf.iter_batches(batch_size=4096, row_groups=[rg], columns=columns):
                lo, hi = max(start - offset, 0), min(stop - offset, batch.num_rows)
                if lo < hi:
                    yield from _parquet_batch(
                        path, batch, offset, lo, hi, text_field, id_field, columnar
                    )
                offset += batch.num_rows
                if offset >= stop:
                    return
    except (OSError, pa.ArrowException) as e:
        raise SourceError(
            f"{path}: truncated or corrupt Parquet file after row {offset} ({e}); download it again"
        ) from None


def _parquet_batch(
    path: str,
    batch: Any,
    offset: int,
    lo: int,
    hi: int,
    text_field: str,
    id_field: str | None,
    columnar: bool = False,
) -> Iterator[Document | BadRecord | TextRun]:
    import pyarrow as pa

    column = batch.column(text_field)
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        # Text stored as bytes (some writers do): the same buffers read as a string
        # column (no copy), so UTF-8 is checked below as for one, and the same bytes
        # come out as from the text stored as string.
        wide = pa.types.is_large_binary(column.type)
        column = column.view(pa.large_string() if wide else pa.string())
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        for row in range(offset + lo, offset + hi):
            yield BadRecord(
                row_where(path, row),
                "missing_text",
                f"field '{text_field}' is not a string (it holds {column.type})",
            )
        return
    if columnar and column.null_count == 0:
        texts = column.slice(lo, hi - lo)
        try:
            texts.validate(full=True)  # pyarrow does not check UTF-8 on read
        except pa.ArrowInvalid:
            pass  # row by row below, which names the bad rows
        else:
            yield TextRun(path, offset + lo, texts)
            return
    try:
        texts = column.slice(lo, hi - lo).to_pylist()
    except UnicodeDecodeError:  # pyarrow does not check UTF-8 on read: find the rows
        raw = column.slice(lo, hi - lo).cast(pa.large_binary()).to_pylist()
        texts = []
        for k, b in enumerate(raw):
            try:
                texts.append(None if b is None else b.decode("utf-8"))
            except UnicodeDecodeError as e:
                texts.append(
                    BadRecord(
                        row_where(path, offset + lo + k),
                        "invalid_utf8",
                        f"invalid UTF-8 at byte {e.start} of the text",
                    )
                )
    ids = (
        batch.column(id_field).slice(lo, hi - lo).to_pylist()
        if id_field and id_field in batch.schema.names
        else [None] * (hi - lo)
    )
    name = Path(path).name
    for k, (text, doc_id) in enumerate(zip(texts, ids, strict=True)):
        row = offset + lo + k
        if isinstance(text, BadRecord):
            yield text
        elif not isinstance(text, str):
            yield BadRecord(
                row_where(path, row), "missing_text", f"field '{text_field}' is not a string"
            )
        else:
            yield Document(
                text, str(doc_id) if doc_id is not None else f"{name}#{row}", row_where(path, row)
            )


def _local_file_records(
    path: str,
    cfg: dict[str, Any],
    start: int = 0,
    stop: int | None = None,
    columnar: bool = False,
    size: ShardSize | None = None,
    byte_range: tuple[int, int | None] | None = None,
) -> Iterator[Document | BadRecord | TextRun]:
    """The records ``start``..``stop`` of one file (all by default); ``columnar``: a
    Parquet file's clean batches as :class:`TextRun`; ``size``: where a JSON lines file's
    position is reported; ``byte_range`` (a plain JSON lines file): only the lines that
    start in it (``start``/``stop`` then apply to those)."""
    text_field, id_field = cfg.get("text_field") or "text", cfg.get("id_field", "id")
    if os.path.getsize(path) == 0:
        if start == 0 and stop != 0:
            yield BadRecord(
                path, "empty_file", "the file is empty; remove it from the source or refill it"
            )
        return
    fmt = cfg.get("format") or _format_of(path)
    if fmt == "parquet":
        yield from _parquet_records(path, text_field, id_field, start, stop, columnar)
        return
    if fmt == "jsonl":
        records = _jsonl_records(path, text_field, id_field, size, *(byte_range or (0, None)))
    elif fmt == "text":
        import datasets

        ds = datasets.load_dataset(
            "text",
            data_files=[path],
            split="train",
            streaming=True,
            sample_by=cfg.get("sample_by", "paragraph"),
        )
        records = _datasets_records(ds, path, "text", None)
    else:
        raise SourceError(f"{path}: unknown format '{fmt}' (one of {', '.join(LOCAL_FORMATS)})")
    yield from itertools.islice(records, start, stop)


def offline_source_error(
    name: str,
    cfg: dict[str, Any],
    mirror_root: str | None,
    *,
    online: bool,
    site: str,
    facts: str,
) -> str | None:
    """Why the hub source ``name`` cannot be downloaded where downloads run (None when it
    can): no internet there (``online`` false: the cluster's ``internet.login``) and no
    mirror, or a mirror folder that is not there. ``site`` and ``facts`` name the cluster
    and its facts file in the message."""
    if cfg.get("type") != "hub" or (online and not (cfg.get("mirror") or mirror_root)):
        return None
    dataset = cfg["dataset"]
    mirror = cfg.get("mirror") or (os.path.join(mirror_root, dataset) if mirror_root else None)
    if mirror and os.path.isdir(mirror):
        return None
    stage = (
        f"Download it where there is internet (`hf download --repo-type dataset {dataset} "
        f"--local-dir <dir>`, `--include '<pattern>'` for a part), copy <dir> to the cluster "
        f"and set text.sources.{name}.mirror: <dir>, or export HPCLLM_HF_MIRROR=<folder> "
        f"with the copy at <folder>/{dataset}."
    )
    if mirror:
        return f"text.sources.{name}: the hub mirror {mirror} of {dataset} does not exist. {stage}"
    return (
        f"text.sources.{name} downloads {dataset} from the Hugging Face hub, but the login "
        f"nodes of {site}, where downloads run, have no internet ({facts}: internet.login). "
        f"{stage}"
    )


def hub_mirror(cfg: dict[str, Any], mirror_root: str | None) -> str | None:
    """The local mirror of a hub source (``mirror``, or ``$HPCLLM_HF_MIRROR/<repo id>``)."""
    mirror = cfg.get("mirror") or (
        os.path.join(mirror_root, cfg["dataset"]) if mirror_root else None
    )
    if mirror:
        if not os.path.isdir(mirror):
            raise SourceError(
                f"hub mirror '{mirror}' of {cfg['dataset']} does not exist; download the "
                "repository there or unset the mirror"
            )
        # A mirror needs no network: say so before datasets reads its settings, so that it
        # never waits on the hub from a machine without internet.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    return mirror


def hub_dataset(cfg: dict[str, Any], mirror_root: str | None = None) -> Any:
    """Open a hub dataset as a streaming ``IterableDataset``.

    A mirror (``mirror`` in the source config, or ``$HPCLLM_HF_MIRROR/<repo id>``) is a
    local copy of the hub repository's files, e.g. made with ``hf download --repo-type
    dataset --local-dir``; ``datasets`` reads it, configs included, without the network,
    which is how it runs under ``HF_DATASETS_OFFLINE=1``. The access token for gated
    datasets (OSCAR) comes from ``HF_TOKEN``, which ``datasets`` reads itself: it is never
    passed, printed or written here.
    """
    mirror = hub_mirror(cfg, mirror_root)
    if mirror:
        script = loading_script(cfg["dataset"], os.listdir(mirror))
        if script:
            raise SourceError(str(script_error(cfg, script)))
    import datasets

    kwargs: dict[str, Any] = {"split": cfg.get("split", "train"), "streaming": True}
    for key in ("name", "data_dir", "revision"):
        if cfg.get(key):
            kwargs[key] = cfg[key]
    if mirror:
        kwargs.pop("revision", None)  # a mirror is one revision already
    try:
        return datasets.load_dataset(mirror or cfg["dataset"], **kwargs)
    except RuntimeError as e:
        if "scripts are no longer supported" not in str(e):
            raise
        script = str(e).rsplit(" ", 1)[-1]
        raise SourceError(str(script_error(cfg, script, f" ({e})"))) from None


def hub_data_files(cfg: dict[str, Any], mirror: str) -> list[str] | None:
    """The local files of a mirrored hub dataset's config and split, in the order
    ``datasets`` streams them, when they are Parquet or JSON lines the package reads in
    place (None otherwise: other formats are streamed with ``datasets``)."""
    script = loading_script(cfg["dataset"], os.listdir(mirror))
    if script:
        raise SourceError(str(script_error(cfg, script)))
    try:
        files = card_data_files(cfg, mirror)  # the card's configs, without datasets' import
    except ScriptDataset as e:
        raise SourceError(f"text.sources: {e}") from None
    if files is not None:
        formats = {_format_quietly(f) for f in files}
        if len(formats) == 1 and formats <= {"parquet", "jsonl"}:
            want = formats.pop()
        else:
            return None
    else:
        import datasets

        kwargs = {k: cfg[k] for k in ("name", "data_dir") if cfg.get(k)}
        builder = datasets.load_dataset_builder(mirror, **kwargs)
        if builder.name not in ("parquet", "json") or getattr(builder.config, "field", None):
            return None
        files = (builder.config.data_files or {}).get(cfg.get("split", "train"))
        if not files or not all(os.path.isfile(f) for f in files):
            return None
        want = "parquet" if builder.name == "parquet" else "jsonl"
    for f in files:
        plain = f.lower().removesuffix(".zst").removesuffix(".gz")
        if _format_quietly(f) != want or plain.endswith(".json"):  # .json: maybe an array
            return None
    return list(files)


def _format_quietly(path: str) -> str | None:
    try:
        return _format_of(path)
    except SourceError:
        return None


def _file_blocks(
    names: list[str],
    local_path: Callable[[str], str],
    cfg: dict[str, Any],
    shard: int,
    num_shards: int,
    columnar: bool = False,
    size: ShardSize | None = None,
) -> Iterator[Document | BadRecord | TextRun]:
    """Shard k of a list of files: a block of whole files when there are enough (each job
    opens, or downloads, only its own), else a block of the records of all of them (the
    records counted once; a Parquet file's from its footer, and only the row groups of
    the block are read). ``size`` (only where ``local_path`` downloads nothing) is filled
    in before the first record: the block's records, or where whole files not all
    Parquet are read, their bytes and how far they are read."""
    if len(names) >= num_shards:
        start, end = block(len(names), shard, num_shards)
        if size is None:
            for name in names[start:end]:  # each file downloaded when its turn comes
                yield from _local_file_records(local_path(name), cfg, columnar=columnar)
            return
        paths = [local_path(n) for n in names[start:end]]
        if all((cfg.get("format") or _format_quietly(p)) == "parquet" for p in paths):
            size.records = sum(_count_records(p, cfg) for p in paths)  # the footers
        else:
            size.file_bytes = sum(os.path.getsize(p) for p in paths)
        for path in paths:
            yield from _local_file_records(path, cfg, columnar=columnar, size=size)
            size.bytes_done += os.path.getsize(path)
            size.bytes_now = 0
        return
    paths = [local_path(n) for n in names]
    if _splits_by_bytes(paths, cfg):
        yield from _byte_blocks(paths, cfg, shard, num_shards, size)
        return
    counts = [_count_records(path, cfg) for path in paths]
    start, stop = block(sum(counts), shard, num_shards)
    if size is not None:
        size.records = stop - start
    offset = 0
    for path, n in zip(paths, counts, strict=True):
        lo, hi = max(start - offset, 0), min(stop - offset, n)
        if lo < hi:
            yield from _local_file_records(path, cfg, lo, hi, columnar)
        offset += n
        if offset >= stop:
            break


def _splits_by_bytes(paths: list[str], cfg: dict[str, Any]) -> bool:
    """Whether the block of a shard can be found by byte offsets: uncompressed, non-empty
    JSON lines files (a compressed file is read from its start anyway; an empty file is
    one bad record, which has no offset)."""
    return all(
        (cfg.get("format") or _format_quietly(p)) == "jsonl"
        and compression_of(p) is None
        and os.path.getsize(p) > 0
        for p in paths
    )


def _byte_blocks(
    paths: list[str],
    cfg: dict[str, Any],
    shard: int,
    num_shards: int,
    size: ShardSize | None,
) -> Iterator[Document | BadRecord | TextRun]:
    """Shard k of JSON lines files (fewer than the shards) by bytes: the files taken as
    one run of bytes cut into ``num_shards`` even parts, shard k gets the lines that
    start in part k. So no job reads, or counts, the records of other shards' parts (it
    counts the newlines before its part in the file where the part starts, for line
    numbers), the blocks concatenate to the source in order, and each line belongs to
    exactly one shard."""
    sizes = [os.path.getsize(p) for p in paths]
    lo, hi = block(sum(sizes), shard, num_shards)
    if size is not None:
        size.file_bytes = hi - lo
    offset = 0
    for path, n in zip(paths, sizes, strict=True):
        begin, end = max(lo - offset, 0), hi - offset
        offset += n
        if begin >= n or end <= 0:
            continue
        yield from _local_file_records(path, cfg, size=size, byte_range=(begin, end))
        if size is not None:
            size.bytes_done += min(end, n) - begin
            size.bytes_now = 0


def shard_documents(
    name: str,
    cfg: dict[str, Any],
    shard: int,
    num_shards: int,
    base: str | os.PathLike = ".",
    columnar: bool = False,
    size: ShardSize | None = None,
) -> Iterator[Document | BadRecord | TextRun]:
    """The raw records of shard ``shard`` of ``num_shards`` (before limits), in source
    order; ``columnar``: clean batches of Parquet rows as :class:`TextRun`; ``size``:
    filled in with what is known of the shard's size before reading (see
    :class:`ShardSize`), for local files and hub mirrors (not for a source read from the
    hub, whose files would be downloaded first)."""
    if not 0 <= shard < num_shards:
        raise SourceError(f"text.sources.{name}: shard {shard} out of range 0..{num_shards - 1}")
    if cfg["type"] == "local":
        files = resolve_local_files(name, cfg, base)
        yield from _file_blocks(files, lambda path: path, cfg, shard, num_shards, columnar, size)
        return
    mirror_root = os.environ.get("HPCLLM_HF_MIRROR")
    if hub_mirror(cfg, mirror_root):
        yield from _hub_documents(name, cfg, shard, num_shards, mirror_root, columnar, size)
        return
    check_hub_reachable(name, cfg)
    try:
        yield from _hub_documents(name, cfg, shard, num_shards, mirror_root, columnar)
    except Exception as e:
        if not _is_connection_error(e):
            raise
        raise SourceError(hub_unreachable(name, cfg, f"{type(e).__name__}: {e}")) from None


def _hub_documents(
    name: str,
    cfg: dict[str, Any],
    shard: int,
    num_shards: int,
    mirror_root: str | None,
    columnar: bool = False,
    size: ShardSize | None = None,
) -> Iterator[Document | BadRecord | TextRun]:
    if reads_files_directly(cfg):
        repo = Repository(cfg, hub_mirror(cfg, mirror_root))
        try:
            names = data_files(repo)
        except ScriptDataset as e:
            raise SourceError(f"text.sources.{name}: {e}") from None
        file_cfg = {**cfg, "text_field": cfg.get("text_field") or default_text_field(cfg)}
        yield from _file_blocks(names, repo.local_path, file_cfg, shard, num_shards, columnar, size)
        return
    mirror = hub_mirror(cfg, mirror_root)
    files = hub_data_files(cfg, mirror) if mirror else None
    if files:
        file_cfg = {**cfg, "text_field": cfg.get("text_field") or "text"}
        yield from _file_blocks(
            files, lambda path: path, file_cfg, shard, num_shards, columnar, size
        )
        return
    ds = hub_dataset(cfg, mirror_root)
    text_field, id_field = cfg.get("text_field") or "text", cfg.get("id_field", "id")
    label = f"{cfg['dataset']}" + (f" ({cfg['name']})" if cfg.get("name") else "")
    if num_shards == 1:
        yield from _datasets_records(ds, label, text_field, id_field)
    elif getattr(ds, "num_shards", 0) >= num_shards:
        # Contiguous blocks of files: each job streams only its own files.
        ds = ds.shard(num_shards=num_shards, index=shard, contiguous=True)
        yield from _datasets_records(ds, f"{label} shard {shard}", text_field, id_field)
    else:
        # Fewer files than shards: count the records once, then take a contiguous block.
        total = sum(1 for _ in ds)
        start, stop = block(total, shard, num_shards)
        if size is not None:
            size.records = stop - start
        stream = _datasets_records(ds, label, text_field, id_field)
        yield from itertools.islice(stream, start, stop)


_TRUE = ("1", "on", "yes", "true")


def hub_unreachable(name: str, cfg: dict[str, Any], detail: str) -> str:
    """The error for a hub source read without a mirror where the hub cannot be reached."""
    repo = cfg["dataset"]
    return (
        f"text.sources.{name}: cannot reach the Hugging Face hub for {repo} ({detail}). "
        "Where there is no internet (compute nodes, offline machines), read a mirror: "
        "download the repository once where there is internet (`hf download "
        f"{repo} --repo-type dataset --local-dir <dir>/{repo}`, --include to take part of "
        f"it), then set `mirror: <dir>/{repo}` on the source, or export "
        "HPCLLM_HF_MIRROR=<dir> (the repository id is appended); see docs/text.md, "
        "'Offline, from a mirror'"
    )


def _is_connection_error(e: BaseException) -> bool:
    """An error of the network path to the hub (as datasets, huggingface_hub, requests
    and httpx raise it), not of the data."""
    names = {c.__name__ for c in type(e).__mro__}
    return bool(
        names & {"ConnectionError", "ConnectError", "ConnectTimeout", "LocalEntryNotFoundError"}
    )


def check_hub_reachable(name: str, cfg: dict[str, Any], timeout: float = 10.0) -> None:
    """Fail at once, naming the mirror, when the hub's host cannot be connected to
    (huggingface_hub retries for about 35 s before its bare ConnectionError). Skipped in
    offline mode (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE: read from the local cache) and
    behind a proxy (a direct connection says nothing there)."""
    if any(
        os.environ.get(v, "").lower() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    ):
        return
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except OSError as e:
        raise SourceError(hub_unreachable(name, cfg, f"{constants.ENDPOINT}: {e}")) from None


def _count_records(path: str, cfg: dict[str, Any]) -> int:
    """How many items ``_local_file_records`` yields for a file, without parsing JSON."""
    if os.path.getsize(path) == 0:
        return 1  # the empty-file bad record
    fmt = cfg.get("format") or _format_of(path)
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(path).metadata.num_rows
        except (OSError, pa.ArrowException) as e:
            raise SourceError(
                f"{path}: truncated or corrupt Parquet file ({e}); download it again"
            ) from None
    if fmt == "jsonl":
        with open_binary(path) as raw:
            lines = (line.removeprefix(UTF8_BOM) if i == 0 else line for i, line in enumerate(raw))
            return sum(1 for line in lines if line.strip())
    return sum(1 for _ in _local_file_records(path, cfg))


def block(total: int, shard: int, num_shards: int) -> tuple[int, int]:
    """Shard k's contiguous block of ``total`` items; the first ``total % N`` get one more
    (the rule of ``datasets.IterableDataset.shard``), so the blocks concatenate in order."""
    base, extra = divmod(total, num_shards)
    start = shard * base + min(shard, extra)
    return start, start + base + (1 if shard < extra else 0)


def shard_limit(total: int | None, shard: int, num_shards: int) -> int | None:
    """An even split of a global limit: shard k gets total//N plus one of the remainder."""
    if total is None:
        return None
    return total // num_shards + (1 if shard < total % num_shards else 0)
