"""Fixtures shared by the integration tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from liftbridge_provider.client.health import HEALTH

AIRFLOW = str(Path(sys.executable).with_name("airflow"))


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """The session's Airflow home (tests/conftest.py), its SQLite metadata DB migrated, with a dags folder."""
    home = Path(os.environ["AIRFLOW_HOME"])
    result = subprocess.run([AIRFLOW, "db", "migrate"], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (home / "dags").mkdir(exist_ok=True)
    return home


@pytest.fixture(autouse=True)
def no_hung_brokers() -> None:
    """Each test starts with no broker suspected: the health model is process-wide, and the cluster fixture's
    addresses are shared, so a broker frozen by one test would otherwise go last in the next."""
    HEALTH.clear()
