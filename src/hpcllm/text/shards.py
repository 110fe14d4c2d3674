"""Write one shard of a text source as compressed JSONL plus a manifest (``download_text``).

Each output line is ``{"id": ..., "text": ...}``. The output is deterministic: the same
source and config give byte-identical files (fixed zstd level, no timestamps), and both
files are renamed into place only when complete.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import zstandard

from hpcllm.atomic import atomic_paths
from hpcllm.progress import Progress
from hpcllm.text.sources import BadRecord, Document, SkipLog, shard_documents, shard_limit

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
    """Read shard ``shard`` of source ``name`` and write it; return the manifest."""
    skipped = SkipLog()
    documents = text_bytes = empty = 0
    start = time.monotonic()
    # The total is known only where the config caps the shard (max_documents).
    progress = Progress(f"download {name} {shard:04d}", policy.max_documents, "documents")
    with atomic_paths(out_jsonl, out_manifest) as (tmp_jsonl, tmp_manifest):
        cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=0)
        with open(tmp_jsonl, "wb") as raw, cctx.stream_writer(raw, closefd=False) as out:
            for item in shard_documents(name, cfg, shard, num_shards, base):
                if isinstance(item, Document):
                    size = len(item.text.encode("utf-8"))
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
                    skipped.add(item.reason, str(item))
                    continue
                if not item.text.strip():
                    empty += 1  # no tokens to train on; counted, not an error
                    continue
                if policy.max_bytes is not None and text_bytes + size > policy.max_bytes:
                    break
                out.write(orjson.dumps({"id": item.id, "text": item.text}) + b"\n")
                documents += 1
                text_bytes += size
                progress.update(documents)
                if policy.max_documents is not None and documents >= policy.max_documents:
                    break
        progress.finish(documents)
        manifest = {
            "source": name,
            "type": cfg["type"],
            "dataset": cfg.get("dataset"),
            "config_name": cfg.get("name"),
            "revision": _revision(cfg),
            "shard": shard,
            "num_shards": num_shards,
            "documents": documents,
            "bytes": text_bytes,
            "empty_documents": empty,
            "skipped": dict(sorted(skipped.counts.items())),
            "skipped_total": skipped.total,
            "skipped_examples": skipped.examples,
        }
        with open(tmp_manifest, "w") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.write("\n")
    log.info(
        "%s shard %d/%d: %d documents, %d bytes, %d empty, %d skipped in %.1f s",
        name,
        shard,
        num_shards,
        documents,
        text_bytes,
        empty,
        skipped.total,
        time.monotonic() - start,
    )
    if documents == 0:
        log.warning("%s shard %d is empty: the source has fewer documents than shards", name, shard)
    return manifest


def _revision(cfg: dict[str, Any]) -> str:
    if cfg["type"] == "local":
        return "local files"
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
        + ". Fix the input (see the shard manifests data/raw/"
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
