"""Logging set-up for workflow scripts: everything goes to the rule's log file."""

from __future__ import annotations

import logging
import sys


def setup(log_path: str | None = None, level: int = logging.INFO) -> None:
    """Log to ``log_path`` (the rule's ``log:``), or stderr; uncaught errors too."""
    handler: logging.Handler = (
        logging.FileHandler(log_path, mode="w") if log_path else logging.StreamHandler()
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Progress lines also on stderr: the terminal of a local job, a Slurm job's output.
    progress = logging.getLogger("hpcllm.progress")
    terminal = logging.StreamHandler(sys.stderr)
    terminal.setFormatter(logging.Formatter("%(message)s"))
    progress.handlers[:] = [terminal] if log_path else []

    def excepthook(exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt):
            # Ctrl-C (SIGINT from the terminal, which Snakemake also gets and reports):
            # one line, no traceback; outputs are written under temporary names, so a
            # rerun of the same command starts this job again from a clean state.
            logging.getLogger("hpcllm").error("interrupted (Ctrl-C); a rerun starts this job again")
            print("interrupted (Ctrl-C); a rerun starts this job again", file=sys.stderr)
            return
        logging.getLogger("hpcllm").error(
            "%s: %s", exc_type.__name__, exc, exc_info=(exc_type, exc, tb)
        )
        sys.__excepthook__(exc_type, exc, tb)

    sys.excepthook = excepthook
