"""Logging set-up for workflow scripts: everything goes to the rule's log file.

An uncaught error is logged with its traceback. On the terminal (Snakemake's, or a Slurm
job's output) the package's own errors (bad input, a refused segment) and a full disk
show their message only: they are not bugs, and the summary at the end of a failed run
repeats the message (``hpcllm.failures.summary``); any other error keeps its traceback there.
"""

from __future__ import annotations

import io
import logging
import sys

from hpcllm.diskspace import DiskFull, from_oserror, is_full


def expected(exc: BaseException) -> bool:
    """An error raised by this package (its classes carry a message that says what is
    wrong and what to do), or a full disk: not a bug, so no traceback for the user."""
    return type(exc).__module__.partition(".")[0] == "hpcllm" or is_full(exc)


def _open_for_writing(tb) -> list[str]:
    """The files open for writing in the frames of a traceback, innermost first: a failed
    ``write`` names no file, the file object it was called on does."""
    names = []
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            name, mode = getattr(value, "name", None), getattr(value, "mode", "")
            if isinstance(value, io.IOBase) and isinstance(name, str) and set("wax+") & set(mode):
                names.append(name)
        tb = tb.tb_next
    return names[::-1]


def _disk_full(exc: OSError, tb) -> DiskFull:
    """A full disk outside ``hpcllm.atomic``: named by its file, else the file being
    written, else the job's outputs (the ``snakemake`` object of a workflow script)."""
    job = getattr(sys.modules.get("__main__"), "snakemake", None)
    outputs = [str(p) for p in getattr(job, "output", None) or []]
    full = from_oserror(exc, _open_for_writing(tb) + outputs)
    full.__cause__ = exc  # the log's traceback shows the original error first
    return full


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
        if is_full(exc) and not isinstance(exc, DiskFull):
            exc_type, exc = DiskFull, _disk_full(exc, tb)
        logging.getLogger("hpcllm").error(
            "%s: %s", exc_type.__name__, exc, exc_info=(exc_type, exc, tb)
        )
        if log_path and expected(exc):
            # A failure the package explains (bad input, a refused step, a full disk): the
            # message on the terminal, the traceback in the log only.
            print(f"{exc_type.__name__}: {exc} (traceback in {log_path})", file=sys.stderr)
            return
        sys.__excepthook__(exc_type, exc, tb)

    sys.excepthook = excepthook
