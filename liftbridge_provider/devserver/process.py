"""One server process: started with its output in a log file, stopped or killed on demand."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from liftbridge_provider.devserver.errors import DevServerError

LOG_TAIL_LINES = 30


def _tie_prefix() -> list[str]:
    """A command prefix that SIGKILLs the server when the thread that started it exits.

    util-linux ``setpriv --pdeathsig`` sets the parent-death signal and then
    execs the server, so the server keeps its own pid. Without setpriv
    (not Linux), servers are only stopped by :meth:`ServerProcess.stop`.
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (state Z) has exited; it only waits for its parent to reap it.
    return _pid_state(pid) != "Z"


def _pid_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` from /proc (``T``: stopped), or None without /proc."""
    return _stat_state(Path(f"/proc/{pid}/stat"))


def _stat_state(stat: Path) -> str | None:
    """The one-letter state in a /proc ``stat`` file (a process's or a thread's), or None if unreadable."""
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


STOP_WAIT = 10.0  # seconds stop_process waits for every thread of a process to stop


def stop_process(pid: int, timeout: float = STOP_WAIT) -> None:
    """SIGSTOP ``pid`` and return once every thread of it has stopped (a vanished peer, for fault tests).

    ``kill`` only queues the signal. The group stop begins when the thread the
    kernel picked handles it: a thread inside a system call that cannot be
    interrupted (an fsync or a page fault on a busy disk) handles it only when
    the call returns, and until then the process's other threads go on
    answering. Raises DevServerError naming the threads still running after
    ``timeout`` seconds (default 10); without /proc it returns once the signal is sent.
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while running := _running_threads(pid):
        if time.monotonic() >= deadline:
            raise DevServerError(f"pid {pid}: threads {', '.join(running)} still running {timeout:g}s after SIGSTOP")
        time.sleep(0.005)


def _running_threads(pid: int) -> list[str]:
    """The threads of ``pid`` that are not stopped, as ``tid:state`` (none without /proc or once it exited)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    running = []
    for tid in tasks:
        state = _stat_state(Path(f"/proc/{pid}/task/{tid}/stat"))
        if state not in (None, "T", "t", "Z", "X"):
            running.append(f"{tid}:{state}")
    return running


def pid_runs(pid: int, executable: Path) -> bool:
    """Whether ``pid`` is alive and runs ``executable`` (guards against reused pids)."""
    if not _pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc: trust the pid
    return bool(cmdline) and Path(os.fsdecode(cmdline[0])).name == executable.name


class ServerProcess:
    """A server process whose stdout and stderr go to ``log_path``.

    :param argv: the command line, executable first.
    :param log_path: file that receives the process output (appended to).
    :param tie_to_parent: on Linux, kill the server when the thread that
        started it exits, so a crashed test run leaves nothing behind.
        Default True; the CLI turns it off so servers outlive it.
    :param pid: attach to an already running process instead (used by the
        CLI's ``stop`` and ``status``).
    :param env: the process environment; default this process's.
    """

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        *,
        tie_to_parent: bool = True,
        pid: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.tie_to_parent = tie_to_parent
        self.env = None if env is None else dict(env)
        self._popen: subprocess.Popen[bytes] | None = None
        self._pid = pid
        self.frozen = False  # stopped with SIGSTOP by freeze(), until thaw()

    @property
    def pid(self) -> int | None:
        """The process id, or None before the first start."""
        return self._popen.pid if self._popen is not None else self._pid

    @property
    def executable(self) -> Path:
        return Path(self.argv[0])

    def start(self) -> None:
        """Start the process; its output is appended to the log file."""
        if self.running:
            raise DevServerError(f"{self.executable.name} is already running as pid {self.pid}")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._popen = subprocess.Popen(
                (_tie_prefix() if self.tie_to_parent else []) + self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # a Ctrl-C in the terminal does not reach the server
            )
        self._pid = self._popen.pid

    @property
    def running(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        return self._pid is not None and pid_runs(self._pid, self.executable)

    @property
    def exit_code(self) -> int | None:
        """The exit status once a process started here has ended, else None."""
        return self._popen.poll() if self._popen is not None else None

    def freeze(self) -> None:
        """Stop the process with SIGSTOP and wait until every thread has stopped (:func:`stop_process`): it
        keeps its sockets open but answers nothing (a vanished peer)."""
        if not self.running:
            raise DevServerError(f"{self.executable.name} is not running; cannot freeze it")
        pid = self.pid
        assert pid is not None  # running
        self.frozen = True  # set first: thaw() must send SIGCONT even if the wait below fails
        stop_process(pid)

    def thaw(self) -> None:
        """Let a frozen process run again with SIGCONT (a no-op when it is not frozen)."""
        if self.frozen:
            self._signal(signal.SIGCONT)
            self.frozen = False

    def stop(self, timeout: float = 15.0) -> None:
        """Stop gracefully with SIGINT (thawing it first); SIGKILL if still running after ``timeout`` seconds."""
        self.thaw()
        if not self.running:
            self._reap()
            return
        self._signal(signal.SIGINT)
        if not self._wait(timeout):
            self.kill()
        self._reap()

    def kill(self) -> None:
        """Kill at once with SIGKILL (a crash, as far as the server can tell)."""
        if self.running:
            self._signal(signal.SIGKILL)  # a stopped (frozen) process dies of SIGKILL too
            if not self._wait(10.0):
                raise DevServerError(f"pid {self.pid} survived SIGKILL")
        self.frozen = False
        self._reap()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return f"(no log at {self.log_path})"
        return "\n".join(text.splitlines()[-lines:])

    def log_contains(self, needle: str, since: int = 0) -> bool:
        """Whether the log, from byte ``since`` on, contains ``needle``."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(since)
                return needle.encode() in log.read()
        except OSError:
            return False

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``condition`` until true; raise with the log tail if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            if condition():
                return
            if not self.running:
                raise DevServerError(
                    f"{self.executable.name} exited (status {self.exit_code}) while waiting for {what}; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise DevServerError(
                    f"{self.executable.name} (pid {self.pid}) not ready after {timeout:.0f}s waiting for {what}; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _signal(self, signum: int) -> None:
        pid = self.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def _wait(self, timeout: float) -> bool:
        if self._popen is not None:
            try:
                self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + timeout
        while self.running:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _reap(self) -> None:
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(0)
