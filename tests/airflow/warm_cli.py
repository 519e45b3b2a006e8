"""Airflow CLI commands run in a fresh process forked from one that has already imported Airflow.

A cold ``airflow dags test`` of a one-task DAG spends about half of its CPU importing Airflow and the
modules of its in-process API (docs/benchmarks.md, "The test suite's time"), and the suite runs about fifty such
commands on a 2-CPU machine. :func:`run_airflow` runs the same entry point as the ``airflow`` script
(``airflow.__main__.main``) in a new process each time, forked from a ``multiprocessing`` forkserver that
imported those modules once per pytest worker. Each command still gets a process of its own: its own
session and process group, environment, exit status, stdout and stderr, and nothing it does outlives it.

Airflow reads part of its configuration at import, so a command whose settings differ from the
forkserver's (``AIRFLOW_HOME``, any ``AIRFLOW__*`` option, ``PYTHONPATH``, a ``LIFTBRIDGE_*`` switch) runs
as a plain subprocess instead. Connections given as ``AIRFLOW_CONN_*`` are read when looked up, and the
provider's ``AIRFLOW__LIFTBRIDGE_EVENTS__*`` options when Airflow loads plugins in the command, and the
``[state_store]`` options when a task's state is kept or cleared, so they may differ. OpenLineage's transport and
statsd's options may not: the forkserver's imports read them (a command forked with them set sent no events).
The forkserver ends with the pytest worker that started it.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
# What an `airflow dags test` / `tasks test` imports before it runs a task; a module that fails to import is
# skipped by the forkserver (the command then imports it itself).
PRELOAD = [
    "airflow",
    "airflow.__main__",
    "airflow.cli.cli_parser",
    "airflow.cli.commands.dag_command",
    "airflow.cli.commands.task_command",
    "airflow.models.dagbag",
    "airflow.sdk",
    "airflow.sdk.execution_time.supervisor",
    "airflow.sdk.execution_time.task_runner",
    "airflow.api_fastapi.execution_api.app",
    "liftbridge_provider.hooks.liftbridge",
    "liftbridge_provider.operators.consume",
    "liftbridge_provider.operators.publish",
    "liftbridge_provider.operators.ranges",
    "liftbridge_provider.operators.streams",
    "liftbridge_provider.sensors.lag",
    "liftbridge_provider.sensors.message",
    "liftbridge_provider.sensors.offset",
    "tests.airflow.warm_cli",
    "tests.airflow.warm_execution_api",  # last: builds the execution API app with the modules above loaded
]
_CONFIG_PREFIXES = ("AIRFLOW", "LIFTBRIDGE_")
# Read when looked up, after the fork: connections and variables, and the provider's [liftbridge_events] options,
# which its plugin reads when Airflow loads plugins, which the preloaded modules do not (the events tests see
# their events only if the command read them).
_RUNTIME_PREFIXES = (
    "AIRFLOW_CONN_",
    "AIRFLOW_VAR_",
    "AIRFLOW__LIFTBRIDGE_EVENTS__",
    "AIRFLOW__STATE_STORE__",
)
_server: dict[str, dict[str, str]] = {}  # "settings": the configuration the forkserver imported Airflow with


def run_airflow(
    args: Sequence[str], env: Mapping[str, str], *, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``airflow <args>`` with exactly ``env`` as its environment, as :func:`subprocess.run` with
    ``capture_output=True, text=True`` would return it; :class:`subprocess.TimeoutExpired` after ``timeout``
    seconds, the command's process group killed."""
    command = [AIRFLOW, *args]
    context = multiprocessing.get_context("forkserver")
    if not _server:
        context.set_forkserver_preload(PRELOAD)
        _server["settings"] = _settings(os.environ)  # the forkserver starts with this process's environment
    if _settings(env) != _server["settings"]:
        return subprocess.run(command, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False)
    with tempfile.TemporaryDirectory(prefix="warm-airflow-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        process = context.Process(target=_command, args=(list(args), dict(env), str(out), str(err)))
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            assert process.pid is not None
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # the command and whatever it started
            process.join(10)
            raise subprocess.TimeoutExpired(command, timeout, _read(out), _read(err))
        return subprocess.CompletedProcess(command, process.exitcode, _read(out), _read(err))


def _settings(env: Mapping[str, str]) -> dict[str, str]:
    """The part of an environment that Airflow or the provider may read at import."""
    return {
        key: value
        for key, value in env.items()
        if (key.startswith(_CONFIG_PREFIXES) and not key.startswith(_RUNTIME_PREFIXES)) or key == "PYTHONPATH"
    }


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _command(args: list[str], env: dict[str, str], out: str, err: str) -> None:
    """In the forked process: a session of its own, the command's environment and output files, then the
    ``airflow`` script's entry point; exit handlers run as at the end of a CLI process."""
    os.setsid()
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["airflow", *args]
    from airflow.__main__ import main  # noqa: PLC0415 - preloaded by the forkserver

    code: int | str | None = 0
    try:
        main()  # type: ignore[no-untyped-call]
    except SystemExit as exit_:
        code = exit_.code
    finally:
        atexit._run_exitfuncs()
        logging.shutdown()
    sys.exit(code)
