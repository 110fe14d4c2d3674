"""The engine's process: the launch on the experiment's nodes, run in its own process
group that dies with the segment, with the segment's signals passed on to it."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcllm.models.megatron_args import MEGATRON_ENV
from hpcllm.training.campaign.signal_lead import EXIT_SIGNAL, SLURM_NAME

log = logging.getLogger(__name__)


class Signals:
    """SIGTERM/SIGUSR1/SIGINT caught from the segment's start (scancel, Ctrl-C; Slurm's
    --signal reaches the job steps, not the batch shell the segment runs in).

    Caught from the start, a signal during the start-up (data checks, before the engine
    runs) ends the segment cleanly instead of killing it half-way; once the engine runs
    it is passed on as the engines' exit signal (SIGUSR2, signal_lead.EXIT_SIGNAL) to the
    launch's process group (its own: a Ctrl-C reaches the engine only this way, also one
    that came while it was being started) and to every process below it: torchrun's
    workers run in sessions of their own, and torchrun ignores SIGUSR2, so that it waits
    for them instead of killing them 30 s after a SIGTERM; on Slurm the launch's srun
    forwards it to the step's processes. The engines save and exit on it. The segment
    sends it again while the engine runs (a worker started after the first one missed
    it) and waits; a second Ctrl-C kills them all at once.
    """

    CAUGHT = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self.interrupted = False  # a Ctrl-C: the job ends with KeyboardInterrupt
        self.child: subprocess.Popen | None = None
        self._previous: dict = {}

    def __enter__(self) -> Signals:
        for s in self.CAUGHT:
            # A process started with SIGINT ignored (in the background) keeps ignoring it.
            if s != signal.SIGINT or signal.getsignal(s) != signal.SIG_IGN:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _handle(self, signum, frame) -> None:
        again = self.interrupted and signum == signal.SIGINT
        self.received = signum
        self.interrupted |= signum == signal.SIGINT
        if self.child is not None and self.child.poll() is None:
            if again:
                log.warning("second Ctrl-C: killing the engine")
                self.signal_child(signal.SIGKILL)
            else:
                log.warning("got signal %d: asking the engine to save and stop", signum)
                self.signal_child(EXIT_SIGNAL)
        else:
            log.warning("got signal %d before the engine started: it will not start", signum)

    def signal_child(self, signum: int) -> None:
        """``signum`` to the launch's process group (the launch script, its launcher and
        the engine), to the child alone if the group is gone, and to every process below
        the child (torchrun's workers, each in a session of its own)."""
        below = descendants(self.child.pid)
        try:
            os.killpg(self.child.pid, signum)
        except ProcessLookupError:
            with contextlib.suppress(ProcessLookupError):
                self.child.send_signal(signum)
        for pid in below:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (Linux's /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # after the command's name
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            found.append(child)
            todo.append(child)
    return found


def _die_with_parent(parent: int):
    """The launch process's pre-exec step: SIGTERM to it when the segment's process dies
    (even by SIGKILL), so that no engine trains on for a job that is gone. Linux's
    PR_SET_PDEATHSIG, kept across the exec of the launch script and of the engine."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork

    def pre_exec() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before: no signal will come
            os._exit(1)

    return pre_exec


# Seconds a launch the watchdog ends gets between SIGTERM and SIGKILL: a hung rank does
# not act on the engines' exit signal (it would have to finish an iteration and save),
# so there is no save to wait for, only the launcher's and the live ranks' own exit.
HANG_KILL_WAIT = 10.0


def run_launch(
    script_text: str,
    script_path: Path,
    engine_log: Path,
    env: dict[str, str],
    signals: Signals | None = None,
    while_running: Callable[[], None] | None = None,
    poll_s: float = 5.0,
    watchdog: Callable[[], object | None] | None = None,
    kill_wait: float = HANG_KILL_WAIT,
) -> int:
    """Run the launch script, its output appended to ``engine_log``; signals passed on;
    ``while_running`` is called every ``poll_s`` seconds until it ends (progress).
    ``watchdog`` too: once it returns something (a stall), the launch is ended, SIGTERM
    then SIGKILL after ``kill_wait`` seconds (:func:`end_hung`)."""
    script_path.parent.mkdir(parents=True, exist_ok=True)
    script_path.write_text(script_text)
    engine_log.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if signals is None:
            signals = stack.enter_context(Signals())
        cut = engine_log.exists() and engine_log.stat().st_size > 0
        if cut:  # a previous attempt killed mid-line: keep its cut line on its own
            with open(engine_log, "rb") as previous:
                previous.seek(-1, os.SEEK_END)
                cut = previous.read(1) != b"\n"
        with open(engine_log, "a") as out:
            if cut:
                out.write("\n")
            out.write(f"==> {time.strftime('%Y-%m-%d %H:%M:%S')} launch {script_path}\n")
            out.flush()
            # Its own process group, so that a Ctrl-C reaches it only through Signals
            # (nothing half-started escapes it); and it dies with this process.
            signals.child = subprocess.Popen(
                ["bash", str(script_path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()),
            )
            if signals.received is not None:  # between the check and the start
                signals.signal_child(EXIT_SIGNAL)
            try:
                while True:
                    try:
                        return signals.child.wait(timeout=poll_s)
                    except subprocess.TimeoutExpired:
                        if signals.received is not None:  # to workers started since
                            signals.signal_child(EXIT_SIGNAL)
                        if while_running:
                            while_running()
                        if watchdog is not None and watchdog() is not None:
                            return end_hung(signals, kill_wait)
            finally:
                signals.child = None


def end_hung(signals: Signals, kill_wait: float) -> int:
    """End a launch that hangs: SIGTERM to its process group and every process below it
    (srun passes it to the step's tasks on the other nodes), SIGKILL after ``kill_wait``
    seconds to all of them that are left, also where the launcher exited meanwhile: a
    frozen or stuck rank does not act on SIGTERM (a stopped one does not even run), and
    torchrun's workers, in sessions of their own, outlive it. Its exit status."""
    log.warning("the watchdog ends the engine: SIGTERM, SIGKILL after %.0f s", kill_wait)
    below = descendants(signals.child.pid)  # found while they are still below it
    signals.signal_child(signal.SIGTERM)
    try:
        rc = signals.child.wait(timeout=kill_wait)
    except subprocess.TimeoutExpired:
        signals.signal_child(signal.SIGKILL)
        rc = signals.child.wait()
    for pid in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return rc


def shutdown_timeout(experiment: dict[str, Any]) -> int:
    """Seconds torchrun lets the workers save and exit after forwarding a SIGTERM (a plain
    scancel, a preemption): the signal's lead (time.signal_seconds), at least torchrun's
    own 30. The fallback before the time limit (SIGUSR2, ignored by torchrun) needs none."""
    return max(30, int((experiment.get("time") or {}).get("signal_seconds") or 0))


def segment_launch(
    experiment: dict[str, Any],
    command: list[str],
    cluster,
    container: str | None,
    heartbeats: dict[str, str] | None = None,
):
    """The launch of a segment's engine ``command`` on the experiment's nodes;
    ``heartbeats``: the environment that tells the torch engine's ranks where to write
    their heartbeat files (hpcllm.training.campaign.watchdog)."""
    from hpcllm.launch import build_launch, package_in_container

    if experiment["engine"] == "megatron":
        # Megatron-LM refuses sequence parallelism without it (one CUDA work queue).
        binds, env = [], dict(MEGATRON_ENV)
    else:  # the torch engine is hpcllm: in an image it needs the checkout's src/
        binds, env = package_in_container(container)
    # Slurm's --signal before the limit is SIGUSR2, which the launcher is started with
    # ignored (signal_lead): the workers save and exit, torchrun waits for them. On a
    # SIGTERM (scancel, a preemption) torchrun forwards it and SIGKILLs the workers after
    # TORCH_ELASTIC_SHUTDOWN_TIMEOUT, 30 s by default: there the signal's lead is theirs
    # (torchrun's --shutdown-timeout, pytorch/pytorch PR 172596; an older torch ignores
    # the variable and keeps 30 s; Slurm's KillWait or GraceTime may end them earlier).
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(shutdown_timeout(experiment))
    env.update(heartbeats or {})
    lay = experiment["layout"]
    return build_launch(
        cluster,
        nodes=lay.get("nodes", 1),
        procs_per_node=lay.get("procs_per_node", 1),
        command=command,
        container=container,
        binds=binds,
        env=env,
        rendezvous=experiment["engine"] == "megatron",
        launcher_ignores=SLURM_NAME,
    )
