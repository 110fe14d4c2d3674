"""Hub datasets read from their data files directly, without ``datasets``' loading script.

``datasets`` 4 and later refuse repositories that ship a loading script
(``RuntimeError: Dataset scripts are no longer supported``). Such a dataset is read here
from its data files: JSON lines (plain or compressed), listed from the repository (the
hub through ``huggingface_hub``, with a gated dataset's token from ``HF_TOKEN``, which
``huggingface_hub`` reads itself; or a local mirror), one shard a contiguous block of
files, each file downloaded only by the shard that reads it.

OSCAR-2301 is known: ``name: de`` reads ``de_meta/*.jsonl.zst`` in the order of
``de_meta/checksum.sha256``, text under ``content``. Any other script dataset names its
files with ``data_files`` (a glob inside the repository).
"""

from __future__ import annotations

import fnmatch
import os
import re
from typing import Any

OSCAR_2301 = "oscar-corpus/OSCAR-2301"
CARD = "README.md"


class ScriptDataset(ValueError):
    """A hub dataset that only its loading script can read, and no way around it is set."""


def loading_script(dataset: str, files: list[str]) -> str | None:
    """The repository's loading script (``<repo name>.py`` at its top), if it has one."""
    script = dataset.rsplit("/", 1)[-1] + ".py"
    return script if script in files else None


def reads_files_directly(cfg: dict[str, Any]) -> bool:
    return bool(cfg.get("data_files")) or cfg["dataset"] == OSCAR_2301


def default_text_field(cfg: dict[str, Any]) -> str:
    return "content" if cfg["dataset"] == OSCAR_2301 else "text"


def script_error(cfg: dict[str, Any], script: str, detail: str = "") -> ScriptDataset:
    return ScriptDataset(
        f"hub dataset {cfg['dataset']} ships a loading script ({script}), which datasets "
        f"4 and later no longer run{detail}. Read its data files directly: set "
        "data_files to their glob inside the repository (e.g. 'de_meta/*.jsonl.zst') and "
        "text_field to the field holding the text"
    )


class Repository:
    """The files of a hub dataset repository, from a local mirror or from the hub."""

    def __init__(self, cfg: dict[str, Any], mirror: str | None):
        self.cfg, self.mirror = cfg, mirror

    def files(self) -> list[str]:
        if self.mirror:
            out = []
            for root, _dirs, names in os.walk(self.mirror):
                rel = os.path.relpath(root, self.mirror)
                out += [os.path.normpath(os.path.join(rel, n)) for n in names]
            return sorted(out)
        from huggingface_hub import HfApi

        return sorted(
            HfApi().list_repo_files(
                self.cfg["dataset"], repo_type="dataset", revision=self.cfg.get("revision")
            )
        )

    def local_path(self, name: str) -> str:
        """A local path of the repository file ``name`` (downloaded to the hub cache)."""
        if self.mirror:
            return os.path.join(self.mirror, name)
        from huggingface_hub import hf_hub_download

        return hf_hub_download(
            self.cfg["dataset"], name, repo_type="dataset", revision=self.cfg.get("revision")
        )


def data_files(repo: Repository, files: list[str] | None = None) -> list[str]:
    """The data files a shard list is cut from, in a fixed order."""
    cfg = repo.cfg
    files = repo.files() if files is None else files
    if cfg.get("data_files"):
        patterns = cfg["data_files"]
        patterns = [patterns] if isinstance(patterns, str) else patterns
        chosen = [f for f in files if any(fnmatch.fnmatchcase(f, p) for p in patterns)]
        if not chosen:
            raise ScriptDataset(
                f"text.sources: data_files {patterns} match no file of {cfg['dataset']} "
                f"(it has {len(files)} files, e.g. {', '.join(files[:5])})"
            )
        return chosen
    # OSCAR-2301: the language's checksum file lists its parts.
    lang = cfg.get("name")
    if not lang:
        raise ScriptDataset(
            f"{OSCAR_2301} needs name: the language (e.g. de), which picks <name>_meta/"
        )
    listing = f"{lang}_meta/checksum.sha256"
    if listing not in files:
        raise ScriptDataset(
            f"{OSCAR_2301} has no {listing}: '{lang}' is not one of its languages "
            f"(found {', '.join(sorted({f.split('_meta/')[0] for f in files if '_meta/' in f})[:20])})"
        )
    with open(repo.local_path(listing)) as f:
        parts = [line.split()[-1] for line in f if line.strip()]
    return [f"{lang}_meta/{os.path.basename(p)}" for p in parts]


def glob_match(pattern: str, path: str) -> bool:
    """``path`` matches ``pattern`` as the hub's globs do: ``*`` and ``?`` stay inside one
    folder, ``**`` crosses folders."""
    regex = ""
    for part in re.split(r"(\*\*/?|\*|\?)", pattern):
        if part in ("**", "**/"):
            regex += "(?:.*/)?" if part == "**/" else ".*"
        elif part == "*":
            regex += "[^/]*"
        elif part == "?":
            regex += "[^/]"
        else:
            regex += re.escape(part)
    return re.fullmatch(regex, path) is not None


def card_patterns(card: str, cfg: dict[str, Any]) -> list[str] | None:
    """The data file globs of the source's config and split from the dataset card's
    ``configs`` (None when the card has no such config)."""
    import yaml  # here: a tokenize job imports this module, and never reads a card

    m = re.match(r"---\s*\n(.*?)\n---\s*(\n|$)", card, re.S)
    meta = (yaml.safe_load(m.group(1)) if m else None) or {}
    name, split = cfg.get("name") or "default", cfg.get("split", "train")
    for config in meta.get("configs") or []:
        if config.get("config_name", "default") != name:
            continue
        files = config.get("data_files")
        if files is None and config.get("data_dir"):
            return [f"{config['data_dir'].rstrip('/')}/**"]
        if isinstance(files, str):
            return [files]
        out: list[str] = []
        for entry in files or []:
            if isinstance(entry, str):
                out.append(entry)
            elif entry.get("split", "train") == split:
                paths = entry.get("path")
                out += [paths] if isinstance(paths, str) else list(paths or [])
        return out
    return None


def card_data_files(cfg: dict[str, Any], mirror: str) -> list[str] | None:
    """The files of a mirror that the source's config and split name in the dataset
    card, in the order ``datasets`` reads them (each glob's matches sorted, globs in
    order, hidden files left out); None when the card names none (no card, no config)."""
    card = os.path.join(mirror, CARD)
    if not os.path.isfile(card):
        return None
    with open(card, encoding="utf-8") as f:
        patterns = card_patterns(f.read(), cfg)
    if not patterns:
        return None
    if cfg.get("data_dir"):
        patterns = [f"{cfg['data_dir'].rstrip('/')}/{p}" for p in patterns]
    files = [
        f
        for f in Repository(cfg, mirror).files()
        if not any(p.startswith(".") for p in f.split("/"))
    ]
    out: list[str] = []
    for pattern in patterns:
        out += [f for f in files if glob_match(pattern, f) and f not in out]
    if not out:
        raise ScriptDataset(
            f"the dataset card of {cfg['dataset']} names {patterns} for config "
            f"'{cfg.get('name') or 'default'}', but no file of the mirror {mirror} matches"
        )
    return [os.path.join(mirror, f) for f in out]
