"""hpcllm (or python -m hpcllm): helpers for users next to the workflow."""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["gpu-check"]:  # its options are its own parser's (hpcllm gpu-check -h)
        from hpcllm.gpu_check import main as gpu_check

        return gpu_check(argv[1:])
    parser = argparse.ArgumentParser(prog="hpcllm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("gpu-check", help="the whole GPU path on this machine (docs/gpu-check.md)")
    p = sub.add_parser(
        "sample-corpus",
        help="rebuild the shipped sample corpus from the documentation on this machine",
    )
    p.add_argument(
        "out_dir",
        nargs="?",
        default="resources/sample_text",
        help="folder of the corpus files (default: %(default)s)",
    )
    p.add_argument(
        "--english-bytes", type=int, default=1_500_000, help="bytes of English text (en.jsonl.zst)"
    )
    p.add_argument(
        "--per-language-bytes",
        type=int,
        default=100_000,
        help="bytes of text per other language (multilingual.jsonl.zst)",
    )
    p = sub.add_parser("config-docs", help="write config/README.md from the config schemas")
    p.add_argument(
        "--schemas", default="workflow/schemas", help="folder of the schemas (default: %(default)s)"
    )
    p.add_argument(
        "--output", default="config/README.md", help="file written (default: %(default)s)"
    )
    p = sub.add_parser("inspect", help="print a summary of a Megatron .bin/.idx dataset")
    p.add_argument("prefix", help="path prefix without .bin/.idx")
    p = sub.add_parser(
        "status",
        help="where the training campaign and benchmark sweeps stand (files and squeue)",
    )
    p.add_argument("-d", "--directory", default=".", help="the workflow's working directory")
    p.add_argument("--configfile", nargs="*", default=[], help="the --configfile files of the run")
    p.add_argument("--profile", default=None, help="the run's profile (gives the cluster)")
    p = sub.add_parser(
        "restart-training",
        help="move an experiment's checkpoints, segment records and logs aside (never "
        "deleted) so that the next run trains it afresh",
    )
    p.add_argument("experiment", help="the experiment's name (checkpoints/<experiment>)")
    p.add_argument("-d", "--directory", default=".", help="the workflow's working directory")
    p = sub.add_parser(
        "cancel-training",
        help="cancel an experiment's whole chain of Slurm jobs (this user's; scancel)",
    )
    p.add_argument("experiment", help="the experiment's name (training.experiments.<name>)")
    p.add_argument("-d", "--directory", default=".", help="the workflow's working directory")
    p = sub.add_parser(
        "retry-training",
        help="after fixing the cause of a chain's stop (out_of_memory, missing_file, ...): "
        "let the next run of the workflow submit the chain anew",
    )
    p.add_argument("experiment", help="the experiment's name (training.experiments.<name>)")
    p.add_argument("-d", "--directory", default=".", help="the workflow's working directory")
    p = sub.add_parser(
        "accept-checkpoint",
        help="record the checksums of a committed checkpoint whose manifest is missing or "
        "broken, as its files are now, when you know they are intact (a segment refused it "
        "as unverified); it first compares what it can and says what it could not check",
    )
    p.add_argument("save", help="the experiment's checkpoint folder, e.g. checkpoints/<name>")
    p.add_argument(
        "--yes",
        action="store_true",
        help="vouch for the files it could not check without being asked (needed where "
        "stdin is not a terminal)",
    )
    sub.add_parser(
        "dag",
        help="read Snakemake's --dag on stdin, write it with each rule's like jobs (a "
        "sweep's points, the segments, the batches) as one box: snakemake ... --dag | "
        "hpcllm dag | dot -Tsvg > dag.svg",
    )
    args = parser.parse_args(argv)
    if args.command == "dag":
        from hpcllm.dag import fold

        sys.stdout.write(fold(sys.stdin.read()))
        return 0
    if args.command == "accept-checkpoint":
        return accept_checkpoint(args.save, args.yes)
    if args.command == "retry-training":
        from hpcllm.training.campaign.chain import describe_stop, retry_training

        stop = retry_training(args.directory, args.experiment)
        if stop is None:
            print(f"{args.experiment}: its chain has not stopped; nothing to clear")
        else:
            print(
                f"cleared: {describe_stop(args.experiment, stop)}. The next run of the "
                "workflow submits the chain anew, from the newest checkpoint"
            )
        return 0
    if args.command == "cancel-training":
        from hpcllm.training.campaign.chain import ChainError, cancel_training

        try:
            cancelled = cancel_training(args.directory, args.experiment)
        except ChainError as e:
            print(f"not cancelled: {e}", file=sys.stderr)
            return 1
        if cancelled:
            print(
                f"cancelled the chain of {args.experiment}: job(s) {', '.join(cancelled)}; "
                "its checkpoints stay, and the workflow run again continues from the newest"
            )
        else:
            print(f"{args.experiment}: no job of its chain is in Slurm; nothing to cancel")
        return 0
    if args.command == "restart-training":
        from hpcllm.training.campaign.restart import restart_training
        from hpcllm.training.checkpoints.lease import LeaseHeld

        try:
            moved = restart_training(args.directory, args.experiment)
        except LeaseHeld as e:
            print(f"not moved: {e}", file=sys.stderr)
            return 1
        if not moved:
            print(
                f"{args.experiment}: no checkpoints, segment records or segment logs in "
                f"{args.directory}; nothing to move"
            )
        else:
            for folder, aside in moved:
                print(f"moved the contents of {folder} to {aside}")
            print(
                f"the next run of the workflow trains {args.experiment} from iteration 0, "
                "every segment again (delete the moved folders once they are not needed)"
            )
        return 0
    if args.command == "status":
        import yaml
        from snakemake.exceptions import WorkflowError

        from hpcllm.training.campaign.status import RunFileMissing, campaign_status

        try:
            print(campaign_status(args.directory, args.configfile, args.profile))
        except (RunFileMissing, ValueError, WorkflowError, yaml.YAMLError) as e:
            # a missing file or a config the plan would refuse: its message, which names
            # the key and what to do (the workflow's own plan-time checks), no traceback
            parser.exit(2, f"hpcllm status: {e}\n")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.command == "sample-corpus":
        from hpcllm.text.sample_corpus import build_sample_corpus

        build_sample_corpus(args.out_dir, args.english_bytes, args.per_language_bytes)
    elif args.command == "config-docs":
        from pathlib import Path

        from hpcllm.configuration import config_reference

        Path(args.output).write_text(config_reference(args.schemas))
    elif args.command == "inspect":
        from hpcllm.text.indexed_dataset import check_dataset

        index = check_dataset(args.prefix)
        print(
            f"{args.prefix}: {len(index.sequence_lengths)} documents, {index.num_tokens} tokens, "
            f"dtype {index.dtype}, longest {int(index.sequence_lengths.max(initial=0))}"
        )
    return 0


def accept_checkpoint(save: str, yes: bool) -> int:
    """``hpcllm accept-checkpoint``: check what can be checked, say what could not, ask
    (on a terminal; elsewhere only ``--yes`` vouches), then record."""
    from hpcllm.training.checkpoints.checksums import check_acceptance, record_accepted
    from hpcllm.training.checkpoints.tracker import CheckpointError

    try:
        acceptance = check_acceptance(save)
    except CheckpointError as e:
        print(f"not accepted: {e}", file=sys.stderr)
        return 1
    print(acceptance.report())
    if acceptance.unchecked and not yes:
        if not sys.stdin.isatty():
            print(
                f"not accepted: {len(acceptance.unchecked)} file(s) could not be checked and "
                "stdin is not a terminal to ask; if you know they are intact, run it again "
                "with --yes",
                file=sys.stderr,
            )
            return 1
        print("Record their checksums as the files are now? [y/N] ", end="", flush=True)
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            print("not accepted: nothing recorded", file=sys.stderr)
            return 1
    record_accepted(acceptance)
    print(
        f"{save}: recorded the checksums of iteration {acceptance.iteration} as its files "
        "are now; the next segment resumes from it"
    )
    return 0
