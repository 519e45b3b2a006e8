"""Shared fixtures: real Liftbridge servers from liftbridge_provider.devserver, and an Airflow home.

Airflow reads its configuration when first imported, so its home (with a SQLite
metadata DB) is set here, before any test module imports it: a fresh temporary
folder per test session unless AIRFLOW_HOME is already set. The run's summary
names the artifacts (screenshots, logs) that tests kept under artifacts/.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

if "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="lbtest-airflow-")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
# Spark: executors run this interpreter, and spark-submit (pip's pyspark) is found next to it.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")

pytest_plugins = ["liftbridge_provider.devserver.pytest_plugin"]
# Helper modules that test modules share: their asserts report as the tests' own do.
pytest.register_assert_rewrite("tests.unit.column_builders", "tests.system.airflow_standalone")

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
STARTED = time.time()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name the artifacts (UI screenshots, server logs) this session kept under artifacts/."""
    kept = sorted(p for p in ARTIFACTS.rglob("*") if p.is_file() and p.stat().st_mtime >= STARTED)
    if kept:
        terminalreporter.section("artifacts kept")
        for path in kept:
            terminalreporter.write_line(str(path))
