"""Which model an export is: its weights' digest, the iteration and when it was made.

``export.json`` names the export (it holds its own timestamp, so its digest changes with
every export, even of the same weights); the weights' digest names the weights: a hash of
the checkpoint's checksums manifest (every file's size and xxh3-128), so the same
checkpoint gives the same digest, and a retrained one (``restart-training`` and a rerun)
another, where its bytes differ.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from hpcllm.training.checkpoints.checksums import MANIFEST


def weights_digest(checkpoint: str | os.PathLike) -> str | None:
    """16 hex digits of SHA-256 over the checkpoint folder's manifest entries (file names,
    sizes and checksums, in name order); None where it has no readable manifest."""
    try:
        manifest = json.loads((Path(checkpoint) / MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(files, dict) or not files:
        return None
    canonical = json.dumps({"algorithm": manifest.get("algorithm"), "files": files}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ExportIdentity:
    iteration: int | None
    exported_at: str | None  # ISO 8601, UTC
    weights_digest: str | None
    digest_source: str  # where the digest comes from, for the reader


def export_identity(export_json: str | os.PathLike) -> ExportIdentity | None:
    """What ``export.json`` says of the model: the digest it recorded, else (an export
    made before it recorded one) the digest of its source checkpoint's manifest now, if
    that checkpoint is still there. None where export.json is unreadable."""
    try:
        info = json.loads(Path(export_json).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict):
        return None
    digest, source = info.get("weights_digest"), "recorded at export"
    if digest is None and info.get("source_checkpoint"):
        digest = weights_digest(info["source_checkpoint"])
        source = "of its checkpoint's manifest now (the export did not record it)"
    return ExportIdentity(info.get("iteration"), info.get("exported_at"), digest, source)
