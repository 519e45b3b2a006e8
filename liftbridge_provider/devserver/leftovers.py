"""Stopping a command that starts many processes (``airflow standalone``), and everything it left running.

A test's Airflow starts processes three ways: children in the command's own session (scheduler, API
server, their forked workers), task processes in sessions of their own, and what those tasks exec
(``spark-submit`` and its Python driver). The first are found by their session; the others by a
variable of the environment they inherited (``AIRFLOW_HOME=<the test's home>``). Neither alone is
enough: ``setproctitle`` (Airflow's API server and executor workers) writes the process title over
the memory /proc reads a process's environment from, so those processes lose the mark.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from liftbridge_provider.devserver.errors import DevServerError

LEFTOVERS_WAIT = 10.0  # seconds kill_leftovers goes on scanning for processes that start meanwhile


def end_session(process: subprocess.Popen[bytes], marked: tuple[str, str], timeout: float = 30.0) -> list[int]:
    """Stop a command started with ``start_new_session=True`` and all it left; return the pids killed last.

    SIGTERM to its process group, SIGKILL to the group if the command has not exited after ``timeout``
    seconds, then :func:`kill_leftovers` for its session and for ``marked`` (``(variable, value)``).
    A group that is already gone is not an error.
    """
    if process.poll() is None:  # once reaped, its pid (and so its group id) may be another process's
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout)
    # Reaped now: a live process with its pid took the number over (the kernel keeps the number while
    # our session has members, so then none can), and the session rule would hit that one's session.
    reused = Path(f"/proc/{process.pid}").exists()
    return kill_leftovers(session=None if reused else process.pid, marked=marked)


def kill_leftovers(*, session: int | None, marked: tuple[str, str], timeout: float = LEFTOVERS_WAIT) -> list[int]:
    """SIGKILL every process of ``session`` (None: no session rule) and every process whose environment
    holds ``marked``.

    A process still stopping may fork one more (a scheduler's executor worker) after a pass over /proc,
    so the scan repeats until one finds nothing, for at most ``timeout`` seconds (then a
    :class:`DevServerError` naming what kept appearing). Exited processes not yet reaped (zombies)
    are not counted.
    """
    killed: list[int] = []
    spared = _ancestry(os.getpid())  # this process and those that started it, whatever their environment
    deadline = time.monotonic() + timeout
    while True:
        found = [pid for pid in leftover_pids(session=session, marked=marked) if pid not in spared]
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed += found
        if not found:
            return killed
        if time.monotonic() > deadline:
            raise DevServerError(f"processes of session {session} or with {marked} kept appearing: {found}")
        time.sleep(0.1)


def leftover_pids(*, session: int | None, marked: tuple[str, str]) -> list[int]:
    """The live processes of ``session`` (its id: the pid of the command that began it) or whose
    environment holds ``marked`` (``(variable, value)``), among those this process may read."""
    marker = "=".join(marked).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, sid = _state_and_session(entry)
            if state != "Z" and (sid == session or marker in (entry / "environ").read_bytes().split(b"\0")):
                pids.append(int(entry.name))
        except (OSError, ValueError, IndexError):  # gone meanwhile, or not ours to read
            continue
    return pids


def _ancestry(pid: int) -> set[int]:
    """``pid`` and its parent, grandparent and so on, up to init."""
    chain = set()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return chain


def _state_and_session(entry: Path) -> tuple[str, int]:
    """State letter and session id from /proc/<pid>/stat (fields 3 and 6; the name may hold spaces)."""
    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
    return fields[0], int(fields[3])
