"""Shared fixtures: real Liftbridge servers from liftbridge_provider.devserver, and an Airflow home.

Airflow reads its configuration when first imported, so its home (with a SQLite
metadata DB) is set here, before any test module imports it: a fresh temporary
folder per test session unless AIRFLOW_HOME is already set.
"""

from __future__ import annotations

import os
import sys
import tempfile

if "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="lbtest-airflow-")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
# Spark: executors run this interpreter, and spark-submit (pip's pyspark) is found next to it.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")

pytest_plugins = ["liftbridge_provider.devserver.pytest_plugin"]
