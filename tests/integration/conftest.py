"""Fixtures shared by the Airflow integration tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

AIRFLOW = str(Path(sys.executable).with_name("airflow"))


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """The session's Airflow home (tests/conftest.py), its SQLite metadata DB migrated, with a dags folder."""
    home = Path(os.environ["AIRFLOW_HOME"])
    result = subprocess.run([AIRFLOW, "db", "migrate"], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (home / "dags").mkdir(exist_ok=True)
    return home
