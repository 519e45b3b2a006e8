"""The compatibility tier: the built wheel, installed with one target's constraints file, against real servers.

``tools/compat.sh TARGET`` makes a fresh virtual environment, installs the wheel
with its extras through pip's normal resolution and ``constraints/TARGET.txt``,
and runs ``pytest -c tests/compat/pytest.ini tests/compat --compat-target TARGET``
from the project folder (the example DAGs, the Spark job and the servers in
``.tools/bin`` come from the checkout; the package from the wheel).

Targets: ``airflow-3.1``, ``airflow-3.2`` (the airflow, spark and iceberg
extras; the Airflow tests), ``pyspark-4.0``, ``pyspark-4.1``, ``pyspark-4.2``
(spark and iceberg, no Airflow: Spark kept in its own environment, as
docs/troubleshooting.md advises; the Spark tests), all on the default Python
(3.11), and ``python-3.12``, ``python-3.13``: the newest Airflow 3.3 and
PySpark 4.3 together on that Python (the airflow, spark and iceberg extras),
running the Airflow tests and the Spark tests. Tests marked for what a target
does not install are deselected, never skipped; the first test checks that the
environment really holds the target's versions and Python.
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
    """What a compatibility target installs: the minor versions of Airflow and PySpark it pins (None: its tests
    of that kind do not run there), and of the Python it is about (None: whichever runs the tier, 3.11)."""

    name: str
    airflow: tuple[int, int] | None
    pyspark: tuple[int, int] | None
    python: tuple[int, int] | None = None

    @property
    def runs(self) -> set[str]:
        """The markers of the tests this target runs."""
        return {m for m, v in (("airflow_target", self.airflow), ("spark_target", self.pyspark)) if v is not None}


TARGETS = {
    "airflow-3.1": Target("airflow-3.1", airflow=(3, 1), pyspark=None),
    "airflow-3.2": Target("airflow-3.2", airflow=(3, 2), pyspark=None),
    "pyspark-4.0": Target("pyspark-4.0", airflow=None, pyspark=(4, 0)),
    "pyspark-4.1": Target("pyspark-4.1", airflow=None, pyspark=(4, 1)),
    "pyspark-4.2": Target("pyspark-4.2", airflow=None, pyspark=(4, 2)),
    "python-3.12": Target("python-3.12", airflow=(3, 3), pyspark=(4, 3), python=(3, 12)),
    "python-3.13": Target("python-3.13", airflow=(3, 3), pyspark=(4, 3), python=(3, 13)),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--compat-target", required=True, choices=sorted(TARGETS), help="the target installed here")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests of a kind the target does not run (an Airflow test needs Airflow, which a PySpark
    target does not install)."""
    runs = TARGETS[config.getoption("--compat-target")].runs
    others = {"airflow_target", "spark_target"} - runs
    deselected = [item for item in items if any(item.get_closest_marker(m) is not None for m in others)]
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
