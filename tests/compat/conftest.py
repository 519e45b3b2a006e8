"""The compatibility tier: the built wheel, installed with one target's constraints file, against real servers.

``tools/compat.sh TARGET`` makes a fresh virtual environment, installs the wheel
with its extras through pip's normal resolution and ``constraints/TARGET.txt``,
and runs ``pytest -c tests/compat/pytest.ini tests/compat --compat-target TARGET``
from the project folder (the example DAGs, the Spark job and the servers in
``.tools/bin`` come from the checkout; the package from the wheel).

Targets: ``airflow-3.1``, ``airflow-3.2`` (the airflow, spark and iceberg
extras) and ``pyspark-4.0``, ``pyspark-4.1``, ``pyspark-4.2`` (spark and
iceberg, no Airflow: Spark kept in its own environment, as
docs/troubleshooting.md advises). Tests marked for
the other kind of target are deselected, never skipped; the first test checks
that the environment really holds the target's versions.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

if "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="lbcompat-airflow-")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")

pytest_plugins = ["liftbridge_provider.devserver.pytest_plugin"]

PROJECT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Target:
    """What a compatibility target installs: ``kind`` (airflow or spark) and the minor version it pins."""

    name: str
    kind: str
    version: tuple[int, int]


TARGETS = {
    "airflow-3.1": Target("airflow-3.1", "airflow", (3, 1)),
    "airflow-3.2": Target("airflow-3.2", "airflow", (3, 2)),
    "pyspark-4.0": Target("pyspark-4.0", "spark", (4, 0)),
    "pyspark-4.1": Target("pyspark-4.1", "spark", (4, 1)),
    "pyspark-4.2": Target("pyspark-4.2", "spark", (4, 2)),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--compat-target", required=True, choices=sorted(TARGETS), help="the target installed here")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests of the other kind of target (an Airflow test needs Airflow, which a PySpark target
    does not install)."""
    kind = TARGETS[config.getoption("--compat-target")].kind
    other = "spark_target" if kind == "airflow" else "airflow_target"
    deselected = [item for item in items if item.get_closest_marker(other) is not None]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


@pytest.fixture(scope="session")
def target(request: pytest.FixtureRequest) -> Target:
    return TARGETS[request.config.getoption("--compat-target")]


@pytest.fixture(scope="session")
def project() -> Path:
    """The checkout: example DAGs (dags/), the Spark entry point (spark_jobs/), servers (.tools/bin)."""
    return PROJECT
