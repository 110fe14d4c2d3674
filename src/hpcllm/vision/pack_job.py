"""The ``pack_lmdb`` rule's job: ``python -m hpcllm.vision.pack_job`` with its values on
the command line.

A ``shell:`` rule instead of ``script:``: Snakemake's script machinery cost each job
0.04-0.13 CPU-s here (its notebook support imported in the job process, then a fresh Python
that unpickles the job's ``snakemake`` object), like ``tar`` + ``sync``'s whole CPU on a
small split (docs/measurements/vision.md). The dataset's config section and the ``vision``
policies come as Python literals (the rule passes its params' ``repr``, the values Snakemake
records for them, unchanged from the earlier ``script:`` rule) or JSON; paths as single
arguments (the rule quotes them), so odd paths pass intact.
"""

from __future__ import annotations

import argparse
import ast
import json
from collections.abc import Sequence
from typing import Any

from hpcllm import logs
from hpcllm.offline import go_offline
from hpcllm.vision.datasets_config import pack_dataset_split


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hpcllm.vision.pack_job",
        description="Pack one split of an image dataset into one LMDB (the pack_lmdb rule).",
    )
    parser.add_argument("--dataset", required=True, help="the dataset's name in vision.datasets")
    parser.add_argument(
        "--dataset-config",
        required=True,
        type=_mapping,
        help="the dataset's config section (vision.datasets.<name>), a dict as a Python "
        "literal or JSON",
    )
    parser.add_argument(
        "--vision",
        type=_mapping,
        default={},
        help="the vision section's pack policies (on_bad_image, check), as --dataset-config",
    )
    parser.add_argument("--split", required=True, help="train or val")
    parser.add_argument("--lmdb", required=True, help="the LMDB folder to write")
    parser.add_argument("--report", required=True, help="the JSON report to write")
    parser.add_argument("--log", required=True, help="the job's log file")
    parser.add_argument("--threads", type=int, default=4, help="reader threads")
    return parser.parse_args(argv)


def _mapping(text: str) -> dict[str, Any]:
    """A dict from its Python literal (``repr``) or JSON."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            raise argparse.ArgumentTypeError(
                f"neither a Python literal nor JSON: {text[:200]}"
            ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"not a dict: {text[:200]}")
    return value


def main(argv: Sequence[str] | None = None) -> None:
    go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)
    args = parse_args(argv)
    logs.setup(args.log)
    pack_dataset_split(
        args.dataset,
        args.dataset_config,
        args.vision,
        args.split,
        args.lmdb,
        args.report,
        threads=args.threads,
    )


if __name__ == "__main__":
    main()
