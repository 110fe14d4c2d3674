"""One shard of a text source: its documents read from the source's own files, with the
shard's policy (bad records, limits), tokenized in place (``tokenize``) or written as a
compressed JSONL copy, plus a manifest.

A JSONL copy's line is ``{"id": ..., "text": ...}``. The output is deterministic: the same
source and config give byte-identical files (fixed zstd level, no timestamps), and both
files are renamed into place only when complete.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import zstandard

from hpcllm.atomic import atomic_paths
from hpcllm.progress import Progress
from hpcllm.text.arrow_texts import blank, utf8_offsets
from hpcllm.text.sources import (
    BadRecord,
    Document,
    ShardSize,
    SkipLog,
    TextRun,
    shard_documents,
    shard_limit,
)

log = logging.getLogger(__name__)

ZSTD_LEVEL = 3
DEFAULT_MAX_DOCUMENT_BYTES = 32 << 20


@dataclass(frozen=True)
class ShardPolicy:
    on_bad_record: str = "fail"  # or "skip"
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES
    max_documents: int | None = None  # for this shard
    max_bytes: int | None = None  # for this shard


def source_policy(
    cfg: dict[str, Any], text_cfg: dict[str, Any], shard: int, num_shards: int
) -> ShardPolicy:
    """The policy of one shard from the source's config and the ``text`` section's defaults."""
    return ShardPolicy(
        on_bad_record=cfg.get("on_bad_record", text_cfg.get("on_bad_record", "fail")),
        max_document_bytes=int(
            cfg.get(
                "max_document_bytes", text_cfg.get("max_document_bytes", DEFAULT_MAX_DOCUMENT_BYTES)
            )
        ),
        max_documents=shard_limit(cfg.get("max_documents"), shard, num_shards),
        max_bytes=shard_limit(cfg.get("max_bytes"), shard, num_shards),
    )


@dataclass
class ShardCounts:
    """What a shard kept and dropped, for its manifest."""

    documents: int = 0
    bytes: int = 0
    empty: int = 0
    skipped: SkipLog = field(default_factory=SkipLog)


def _keep(
    item: Document | BadRecord, name: str, policy: ShardPolicy, counts: ShardCounts
) -> tuple[Document | None, bool]:
    """One record under the shard's policy: ``(document or None, stop after it)``. Bad
    records raise (``on_bad_record: fail``) or are counted, empty documents are counted
    and dropped, and the shard's limits end it."""
    if isinstance(item, Document):
        text = item.text
        # An ASCII string's length is its size in UTF-8: no encoded copy to count it.
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
        if size > policy.max_document_bytes:
            item = BadRecord(
                item.where,
                "too_large",
                f"document of {size} bytes exceeds max_document_bytes="
                f"{policy.max_document_bytes}; raise the limit or skip bad records",
            )
    if isinstance(item, BadRecord):
        if policy.on_bad_record != "skip":
            raise BadRecord(
                item.where,
                item.reason,
                f"{str(item).split(': ', 1)[1]} (source '{name}'; fix the input or set "
                f"text.sources.{name}.on_bad_record: skip to skip and count such records)",
            )
        counts.skipped.add(item.reason, str(item))
        return None, False
    if not text or text.isspace():  # strip() would copy most documents
        counts.empty += 1  # no tokens to train on; counted, not an error
        return None, False
    if policy.max_bytes is not None and counts.bytes + size > policy.max_bytes:
        return None, True
    if policy.max_documents is not None and counts.documents >= policy.max_documents:
        return None, True  # a shard whose share of the limit is 0
    counts.documents += 1
    counts.bytes += size
    full = policy.max_documents is not None and counts.documents >= policy.max_documents
    return item, full


def shard_texts(
    name: str,
    cfg: dict[str, Any],
    policy: ShardPolicy,
    shard: int,
    num_shards: int,
    counts: ShardCounts,
    base: str | os.PathLike = ".",
) -> Iterator[Document]:
    """The documents shard ``shard`` keeps, in source order, read from the source's own
    files: bad records raise (``on_bad_record: fail``) or are counted in ``counts``,
    empty documents are dropped and counted, the shard's limits applied."""
    for item in shard_documents(name, cfg, shard, num_shards, base):
        doc, stop = _keep(item, name, policy, counts)
        if doc is not None:
            yield doc
        if stop:
            return


def _keep_run(
    run: TextRun, policy: ShardPolicy, counts: ShardCounts
) -> tuple[list[Any], bool] | None:
    """:func:`_keep` on every row of ``run`` at once: ``(the rows kept, as slices of the
    Arrow array, stop)``, the same rows and counts as row by row; ``None`` when a row is
    too large (then the rows go one by one, to report it)."""
    texts = run.texts
    offsets = utf8_offsets(texts)
    sizes = np.diff(offsets)
    if len(sizes) and sizes.max() > policy.max_document_bytes:
        return None
    empty = blank(texts, offsets)
    keep = np.flatnonzero(~empty)
    end, stop = len(sizes), False  # rows from ``end`` on are not reached
    if policy.max_bytes is not None:
        over = np.flatnonzero(counts.bytes + np.cumsum(sizes[keep]) > policy.max_bytes)
        if len(over):
            end, keep, stop = int(keep[over[0]]), keep[: over[0]], True
    if policy.max_documents is not None:
        room = max(policy.max_documents - counts.documents, 0)
        if room and len(keep) >= room:
            end, keep, stop = min(end, int(keep[room - 1]) + 1), keep[:room], True
        elif not room and len(keep):
            end, keep, stop = min(end, int(keep[0])), keep[:0], True
    counts.empty += int(empty[:end].sum())
    counts.documents += len(keep)
    counts.bytes += int(sizes[keep].sum())
    # Runs of consecutive kept rows, as slices (no copy; empty documents are few).
    cuts = np.flatnonzero(np.diff(keep) != 1) + 1
    runs = [(int(r[0]), int(r[-1]) + 1) for r in np.split(keep, cuts) if len(r)]
    return [texts.slice(a, b - a) for a, b in runs], stop


def shard_batches(
    name: str,
    cfg: dict[str, Any],
    policy: ShardPolicy,
    shard: int,
    num_shards: int,
    counts: ShardCounts,
    batch_bytes: int,
    base: str | os.PathLike = ".",
    shard_size: ShardSize | None = None,
) -> Iterator[Any]:
    """The texts :func:`shard_texts` keeps, in batches of about ``batch_bytes``: lists of
    ``str``, or Arrow string arrays where a Parquet file's rows are clean (no Python
    string per document: the tokenizer reads the array's buffers). ``shard_size`` is
    filled in as :func:`hpcllm.text.sources.shard_documents` says."""
    batch: list[str] = []
    size = 0
    documents = shard_documents(name, cfg, shard, num_shards, base, True, shard_size)
    for item in documents:
        if isinstance(item, TextRun):
            kept = _keep_run(item, policy, counts)
            if kept is not None:
                if batch:
                    yield batch
                    batch, size = [], 0
                runs, stop = kept
                for texts in runs:
                    yield from _slices(texts, batch_bytes)
                if stop:
                    return
                continue
            items: Iterable[Document | BadRecord] = item.documents()
        else:
            items = (item,)
        for record in items:
            doc, stop = _keep(record, name, policy, counts)
            if doc is not None:
                batch.append(doc.text)
                size += len(doc.text)
                if size >= batch_bytes:
                    yield batch
                    batch, size = [], 0
            if stop:
                if batch:
                    yield batch
                return
    if batch:
        yield batch


def _slices(texts: Any, batch_bytes: int) -> Iterator[Any]:
    """An Arrow string array in consecutive slices of about ``batch_bytes`` (no copy)."""
    offsets = utf8_offsets(texts)
    ends = offsets[1:] - offsets[0]
    start = 0
    while start < len(texts):
        before = ends[start - 1] if start else 0
        stop = int(np.searchsorted(ends, before + batch_bytes, side="left")) + 1
        stop = min(max(stop, start + 1), len(texts))
        yield texts.slice(start, stop - start)
        start = stop


def shard_manifest(
    name: str, cfg: dict[str, Any], shard: int, num_shards: int, counts: ShardCounts
) -> dict[str, Any]:
    return {
        "source": name,
        "type": cfg["type"],
        "dataset": cfg.get("dataset"),
        "config_name": cfg.get("name"),
        "revision": _revision(cfg),
        "shard": shard,
        "num_shards": num_shards,
        "documents": counts.documents,
        "bytes": counts.bytes,
        "empty_documents": counts.empty,
        "skipped": dict(sorted(counts.skipped.counts.items())),
        "skipped_total": counts.skipped.total,
        "skipped_examples": counts.skipped.examples,
    }


def _write_manifest(path: str | os.PathLike, manifest: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")


def _log_shard(name: str, shard: int, num_shards: int, counts: ShardCounts, start: float) -> None:
    log.info(
        "%s shard %d/%d: %d documents, %d bytes, %d empty, %d skipped in %.1f s",
        name,
        shard,
        num_shards,
        counts.documents,
        counts.bytes,
        counts.empty,
        counts.skipped.total,
        time.monotonic() - start,
    )
    if counts.documents == 0:
        log.warning("%s shard %d is empty: the source has fewer documents than shards", name, shard)


def tokenize_source_shard(
    name: str,
    cfg: dict[str, Any],
    policy: ShardPolicy,
    shard: int,
    num_shards: int,
    output_prefix: str | os.PathLike,
    out_manifest: str | os.PathLike,
    tok: Any,
    eod_token: str | None,
    base: str | os.PathLike = ".",
    batch_bytes: int = 4 << 20,
    **tokenize_options: Any,
) -> dict[str, Any]:
    """Tokenize shard ``shard`` of source ``name`` straight from the source's files
    (Parquet, JSON lines, text; no intermediate copy) into ``{output_prefix}.bin/.idx``
    and write its manifest; return the manifest. ``tokenize_options`` go to
    :func:`hpcllm.text.tokenization.tokenize_shard`."""
    from hpcllm.text.tokenization import tokenize_shard

    counts, size = ShardCounts(), ShardSize()
    start = time.monotonic()
    batches = shard_batches(name, cfg, policy, shard, num_shards, counts, batch_bytes, base, size)

    def total() -> int | None:
        """The shard's records (from the files' metadata, or estimated from the bytes
        read), at most its max_documents, for the progress lines."""
        read = counts.documents + counts.empty + counts.skipped.total
        known = [n for n in (size.estimate(read), policy.max_documents) if n is not None]
        return min(known, default=None)

    with atomic_paths(out_manifest) as (tmp_manifest,):
        tokenize_shard(
            batches,
            output_prefix,
            tok,
            eod_token,
            batch_bytes=batch_bytes,
            total_documents=total,
            label=f"{name} shard {shard}",
            **tokenize_options,
        )
        manifest = shard_manifest(name, cfg, shard, num_shards, counts)
        _write_manifest(tmp_manifest, manifest)
    _log_shard(name, shard, num_shards, counts, start)
    return manifest


class ShardReader:
    """A shard's kept texts, read when iterated (for tokenizer training)."""

    def __init__(self, name: str, cfg: dict[str, Any], policy: ShardPolicy, shard: int, n: int):
        self.name, self.cfg, self.policy, self.shard, self.n = name, cfg, policy, shard, n

    def __iter__(self) -> Iterator[str]:
        counts = ShardCounts()
        for doc in shard_texts(self.name, self.cfg, self.policy, self.shard, self.n, counts):
            yield doc.text

    def __str__(self) -> str:
        return f"{self.name} shard {self.shard}"


def source_shard_readers(
    sources: dict[str, dict[str, Any]], text_cfg: dict[str, Any]
) -> list[ShardReader]:
    """Every shard of ``sources`` (name: config with ``num_shards``) in order, as
    :class:`ShardReader`: what the tokenizer trains on, the same documents as tokenized."""
    readers = []
    for name, cfg in sources.items():
        n = cfg["num_shards"]
        readers += [
            ShardReader(name, cfg, source_policy(cfg, text_cfg, k, n), k, n) for k in range(n)
        ]
    return readers


def write_shard(
    name: str,
    cfg: dict[str, Any],
    policy: ShardPolicy,
    shard: int,
    num_shards: int,
    out_jsonl: str | os.PathLike,
    out_manifest: str | os.PathLike,
    base: str | os.PathLike = ".",
) -> dict[str, Any]:
    """Read shard ``shard`` of source ``name`` and write it as a ``.jsonl.zst`` copy;
    return the manifest. Only for the tools and tests that want the documents as a file:
    the workflow tokenizes from the source's own files (:func:`tokenize_source_shard`)."""
    counts = ShardCounts()
    start = time.monotonic()
    # The total is known only where the config caps the shard (max_documents).
    progress = Progress(f"download {name} {shard:04d}", policy.max_documents, "documents")
    with atomic_paths(out_jsonl, out_manifest) as (tmp_jsonl, tmp_manifest):
        cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=0)
        with open(tmp_jsonl, "wb") as raw, cctx.stream_writer(raw, closefd=False) as out:
            for doc in shard_texts(name, cfg, policy, shard, num_shards, counts, base):
                out.write(orjson.dumps({"id": doc.id, "text": doc.text}) + b"\n")
                progress.update(counts.documents)
        progress.finish(counts.documents)
        manifest = shard_manifest(name, cfg, shard, num_shards, counts)
        _write_manifest(tmp_manifest, manifest)
    _log_shard(name, shard, num_shards, counts, start)
    return manifest


def _revision(cfg: dict[str, Any]) -> str:
    if cfg["type"] == "local":
        return "local files"
    if cfg.get("mirror"):
        # A mirror fetch_text wrote (data/hub/<source>/files): the commit it resolved.
        fetched = Path(cfg["mirror"]).parent / "fetched.json"
        if Path(cfg["mirror"]).name == "files" and fetched.is_file():
            try:
                return f"{json.loads(fetched.read_text())['revision']} (fetched)"
            except (OSError, ValueError, KeyError):
                pass
    if cfg.get("mirror") or os.environ.get("HPCLLM_HF_MIRROR"):
        return f"local mirror ({cfg.get('revision') or 'revision as downloaded'})"
    return cfg.get("revision") or "main"


class TooFewDocuments(ValueError):
    """A merged dataset below its minimum size; names the source and why it is small."""


def check_source_size(source: str, manifests: list[str | os.PathLike], min_documents: int) -> int:
    """The number of documents the source's shards wrote; an error naming the source and
    its skip counts when below ``min_documents`` (an empty merged ``.bin`` is a file
    Megatron Core cannot open). A single empty shard is fine."""
    documents = empty = 0
    skipped: dict[str, int] = {}
    examples: list[str] = []
    for path in manifests:
        with open(path) as f:
            m = json.load(f)
        documents += m["documents"]
        empty += m.get("empty_documents", 0)
        for reason, n in m.get("skipped", {}).items():
            skipped[reason] = skipped.get(reason, 0) + n
        examples += m.get("skipped_examples", [])[: 3 - len(examples)]
    if documents >= min_documents:
        return documents
    why = ", ".join(f"{reason}: {n}" for reason, n in sorted(skipped.items())) or "none"
    raise TooFewDocuments(
        f"source '{source}': its {len(manifests)} shard(s) hold {documents} documents, "
        f"fewer than min_documents: {min_documents}. Skipped records by reason: {why}; "
        f"empty documents dropped: {empty}"
        + (f"; first skipped: {'; '.join(examples)}" if examples else "")
        + ". Fix the input (see the shard manifests data/tokenized/<tokenizer>/"
        + f"{source}/*.manifest.json) or lower text.sources.{source}.min_documents"
    )


def manifest_documents(jsonl_path: str | os.PathLike) -> int | None:
    """The record count of a shard's JSONL from the manifest written beside it (for
    progress lines), or None without a readable one."""
    path = Path(str(jsonl_path).removesuffix(".zst").removesuffix(".jsonl") + ".manifest.json")
    try:
        manifest = json.loads(path.read_text())
        return int(manifest["documents"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
