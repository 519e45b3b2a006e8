"""Set up and clean up after an `airflow standalone` of the system tests: migrate its metadata DB, and kill
what its tasks left running.

Shared by tests/system/test_example_dags.py and test_event_listener.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def kill_left_behind(airflow_home: str) -> None:
    """SIGKILL what this Airflow left running: task processes run in their own sessions, so a task still
    running when `airflow standalone` stops (a later batch's spark-submit and its Python driver) outlives it."""
    marker = f"AIRFLOW_HOME={airflow_home}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:  # gone meanwhile, or not ours to read
            continue


def migrate(env: dict[str, str]) -> None:
    """Migrate the metadata DB of the Airflow home ``env`` names (`airflow db migrate`)."""
    airflow = str(Path(sys.executable).with_name("airflow"))
    command = [airflow, "db", "migrate"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
