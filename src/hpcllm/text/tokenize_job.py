"""One tokenize job: ``python -m hpcllm.text.tokenize_job ...`` (rule ``tokenize``).

The rule runs this module from ``shell:`` rather than a ``script:`` (issue 51 item 11):
for a ``script:`` rule Snakemake imports nbformat and jsonschema in the job process and
then starts a second Python that unpickles the job, about 0.18 CPU-s of every shard's job.
The rule's params come on the command line, the configs as JSON objects; the module sets
the environment the libraries read at import (offline hub, the encoder's threads) before
importing them.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any


def json_object(text: str) -> dict[str, Any]:
    """A JSON object from the command line (argparse names the option when this fails)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): {text[:200]!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"not a JSON object: {text[:200]!r}")
    return value


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m hpcllm.text.tokenize_job",
        description="Tokenize one shard of a text source into Megatron's .bin/.idx and "
        "its manifest (what rule tokenize runs; docs/text.md).",
    )
    ap.add_argument("--source", required=True, help="the source's name (text.sources)")
    ap.add_argument("--shard", type=int, required=True, help="this shard's number, from 0")
    ap.add_argument("--num-shards", type=int, required=True, help="the source's shards")
    ap.add_argument(
        "--source-config", type=json_object, required=True, help="the source's config (JSON)"
    )
    ap.add_argument(
        "--defaults",
        type=json_object,
        required=True,
        help="the text section's defaults for bad records (JSON)",
    )
    ap.add_argument(
        "--tokenizer-config", type=json_object, required=True, help="the tokenizer's config (JSON)"
    )
    ap.add_argument(
        "--tokenizer-files", nargs="+", required=True, help="tokenizer.json, or vocab and merges"
    )
    ap.add_argument(
        "--settings",
        type=json_object,
        required=True,
        help="text.tokenize's append_eod, encoder, batch_bytes, special_tokens_in_text (JSON)",
    )
    ap.add_argument("--prefix", required=True, help="the output's path without .bin/.idx")
    ap.add_argument("--manifest", required=True, help="the shard's manifest to write")
    ap.add_argument("--threads", type=int, required=True, help="the encoder's threads")
    ap.add_argument("--log", required=True, help="the job's log file")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from hpcllm.offline import go_offline

    go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before tokenizers starts its pool

    from hpcllm import logs
    from hpcllm.text.shards import source_policy, tokenize_source_shard
    from hpcllm.text.tokenizers_config import tokenizer_for

    logs.setup(args.log)
    cfg, settings, tok_cfg = args.source_config, args.settings, args.tokenizer_config
    tokenize_source_shard(
        args.source,
        cfg,
        source_policy(cfg, args.defaults, args.shard, args.num_shards),
        args.shard,
        args.num_shards,
        args.prefix,
        args.manifest,
        tokenizer_for(tok_cfg, args.tokenizer_files),
        tok_cfg["eod_token"],
        append_eod=settings["append_eod"],
        encoder=settings["encoder"],
        batch_bytes=settings["batch_bytes"],
        special_tokens_in_text=settings["special_tokens_in_text"],
    )


if __name__ == "__main__":
    main()
