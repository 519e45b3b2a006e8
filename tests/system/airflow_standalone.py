"""Set up an `airflow standalone` of the system tests: migrate its metadata DB (devserver.leftovers.end_session
stops it and what its tasks left running).

Shared by tests/system/test_example_dags.py and test_event_listener.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# `airflow standalone` starts its scheduler and its API server side by side, and the scheduler may hand a task
# to its executor before the API server listens: the task's supervisor then retries the execution API
# (exponential waits from 1 s, 5 attempts by default, about 15 s) and fails the task. On a loaded machine the
# API server took longer than that to start (a CI run: every task of the run failed with "connection refused").
# Ten attempts wait minutes; a user's standalone has the same race and the same setting.
STANDALONE_ENV = {"AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "10"}


def migrate(env: dict[str, str]) -> None:
    """Migrate the metadata DB of the Airflow home ``env`` names (`airflow db migrate`)."""
    airflow = str(Path(sys.executable).with_name("airflow"))
    command = [airflow, "db", "migrate"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
