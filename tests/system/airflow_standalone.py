"""Set up an `airflow standalone` of the system tests: migrate its metadata DB (devserver.leftovers.end_session
stops it and what its tasks left running).

Shared by tests/system/test_example_dags.py and test_event_listener.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def migrate(env: dict[str, str]) -> None:
    """Migrate the metadata DB of the Airflow home ``env`` names (`airflow db migrate`)."""
    airflow = str(Path(sys.executable).with_name("airflow"))
    command = [airflow, "db", "migrate"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
