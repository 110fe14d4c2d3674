"""Why jobs failed, for the terminal: the reason line of each failed job's log and the
workflow-level fix where there is one.

Snakemake reports a failed job as ``Error in rule X: message: None ... log: <path> (check
log file(s) for error details)``. The Snakefile's ``onerror:`` hook calls
:func:`failure_summary` with Snakemake's own log of the run; it finds those blocks, reads
each job's log and prints the error line the job logged (``hpcllm.logs`` writes uncaught
errors as one ``ERROR`` line first), the log's path, and how to rerun when the reason is a
workflow file that is corrupt (``--forcerun <file>`` makes that file again and everything
made from it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

# A block of Snakemake's log: "Error in rule NAME:" ... "log: a, b (check log file(s) ...)".
_ERROR_RULE = re.compile(r"^Error in (?:group job|rule) (\S+?):?$")
_LOG_LINE = re.compile(r"^\s+log: (.*?)(?: \(check log file\(s\) for error details\))?$")
# hpcllm.logs: "2026-01-01 12:00:00,123 ERROR hpcllm: CorruptInput: <message>".
_LOGGED_ERROR = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?:ERROR|CRITICAL) [^:\s]+: (.+)$")
_LOGGED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")
# A Python exception's last line, for logs not written through hpcllm.logs.
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Input|Interrupt))(: .+)?$")
# A file the workflow makes, named in a reason that says it is damaged.
_WORKFLOW_FILE = re.compile(r"((?:data|results|containers)/[^\s:,'\"()]+)")
_DAMAGED = ("corrupt", "truncated", "does not match", "not match its")


def failed_jobs(snakemake_log: str) -> list[tuple[str, list[str]]]:
    """(rule, log paths) of every failed job in the text of Snakemake's log of a run."""
    jobs: list[tuple[str, list[str]]] = []
    rule = None
    for line in snakemake_log.splitlines():
        m = _ERROR_RULE.match(line.strip())
        if m:
            rule = m.group(1)
            jobs.append((rule, []))
            continue
        if rule is None:
            continue
        m = _LOG_LINE.match(line)
        if m:
            jobs[-1][1].extend(p.strip() for p in m.group(1).split(",") if p.strip())
            rule = None
        elif line and not line.startswith((" ", "\t")):
            rule = None  # the block ended without a log line
    return jobs


def reason_line(log_path: str) -> str | None:
    """The error a job's log ends with: the last ERROR line hpcllm.logs wrote, else the
    last line shaped like a Python exception; None when there is neither."""
    try:
        with open(log_path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    logged = [i for i, line in enumerate(lines) if _LOGGED_ERROR.match(line)]
    if logged:
        # A message of several lines (a batch's failed shards, each with its reason) goes
        # on to its traceback or the next logged line.
        first = logged[-1]
        reason = [_LOGGED_ERROR.match(lines[first]).group(1).strip()]
        for line in lines[first + 1 :]:
            if line.startswith("Traceback (most recent call last)") or _LOGGED.match(line):
                break
            if line.strip():
                reason.append(line.rstrip())
        return "\n".join(reason)
    raised = [line.strip() for line in lines if _EXCEPTION.match(line.strip())]
    return raised[-1] if raised else None


def workflow_fix(reason: str) -> str | None:
    """The rerun that repairs a damaged file the workflow made, named in ``reason``."""
    if not any(word in reason.lower() for word in _DAMAGED):
        return None
    m = _WORKFLOW_FILE.search(reason)
    if not m:
        return None
    path = m.group(1).rstrip(".")
    return (
        f"rerun the same command with --forcerun {path} (makes that file again, then "
        "everything made from it)"
    )


def failure_summary(snakemake_logs: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """The lines to print after a failed run, from Snakemake's log file(s) of the run."""
    if isinstance(snakemake_logs, (str, os.PathLike)):
        snakemake_logs = [snakemake_logs]
    text = ""
    for path in snakemake_logs:
        try:
            with open(path, errors="replace") as f:
                text += f.read()
        except OSError:
            continue
    lines: list[str] = []
    seen = set()
    for rule, logs in failed_jobs(text):
        reasons = [(log, reason_line(log)) for log in logs]
        found = [(log, r) for log, r in reasons if r]
        if not found:
            where = ", ".join(logs) or "no log: see the job's output above"
            key = (rule, where)
            if key not in seen:
                seen.add(key)
                lines.append(f"  {rule}: no error line in its log ({where})")
            continue
        log, reason = found[0]
        if (rule, log) in seen:
            continue
        seen.add((rule, log))
        first, *more = reason.splitlines()
        lines.append(f"  {rule} ({log}): {first}")
        lines += [f"    {line.strip()}" for line in more]
        fix = workflow_fix(reason)
        if fix:
            lines.append(f"    fix: {fix}")
    if lines:
        lines.insert(0, "Why the jobs failed (each job's log says more):")
    return lines
