"""Shared fixtures: real Liftbridge servers from liftbridge_provider.devserver, and an Airflow home.

The tests are laid out by cost, one folder per tier, and each test carries its
tier's marker (``-m unit`` and so on): ``unit/`` (pure logic: no servers, no
subprocesses, seconds in all; ``make test-fast``), ``server/`` (a real
Liftbridge node or cluster), ``airflow/`` (real Airflow: in process, the CLI,
the triggerer, the UI in a browser), ``spark/`` (real Spark: the data source,
the ingest job, Delta and Iceberg), ``system/`` (the example DAGs and the
plugin end to end) and ``chaos/`` (the seeded fault harness).

Airflow reads its configuration when first imported, so its home (with a SQLite
metadata DB) is set here, before any test module imports it: a fresh temporary
folder per test session unless AIRFLOW_HOME is already set. The run's summary
names the artifacts (screenshots, logs) that tests kept under artifacts/.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from liftbridge_provider.client import LiftbridgeClient, NoSuchStreamError
from liftbridge_provider.client.health import HEALTH
from liftbridge_provider.devserver import DevServer
from tests.spark_classes import jvm_options

# Under pytest-xdist (`make test` runs the tiers on parallel workers) each worker inherits the home its
# controller made, so a worker makes its own: two processes migrating one SQLite DB would lock each other.
MADE_HOME = "LBTEST_MADE_AIRFLOW_HOME"
if "AIRFLOW_HOME" not in os.environ or (
    os.environ.get(MADE_HOME) == os.environ["AIRFLOW_HOME"] and "PYTEST_XDIST_WORKER" in os.environ
):
    os.environ["AIRFLOW_HOME"] = os.environ[MADE_HOME] = tempfile.mkdtemp(prefix="lbtest-airflow-")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
# Spark: executors run this interpreter, and spark-submit (pip's pyspark) is found next to it.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
# The tests' JVMs run with C1 only, one GC thread and an archive of Spark's classes made by
# `make test` (tests/spark_classes.py). Same Spark, same code paths; users' JVMs keep the defaults.
os.environ.setdefault("SPARK_SUBMIT_OPTS", jvm_options())
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", jvm_options())

pytest_plugins = [
    "liftbridge_provider.devserver.pytest_plugin",
    "tests.spark_session",
    "tests.object_store",
    "tests.file_costs",
]
# Helper modules that test modules share: their asserts report as the tests' own do.
pytest.register_assert_rewrite("tests.unit.column_builders", "tests.system.airflow_standalone")

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "server", "airflow", "spark", "system", "chaos")
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
STARTED = time.time()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name the artifacts (UI screenshots, server logs) this session kept under artifacts/."""
    kept = sorted(p for p in ARTIFACTS.rglob("*") if p.is_file() and p.stat().st_mtime >= STARTED)
    if kept:
        terminalreporter.section("artifacts kept")
        for path in kept:
            terminalreporter.write_line(str(path))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its tier: the folder under tests/ it lives in."""
    for item in items:
        tier = item.path.relative_to(TESTS).parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """The session's Airflow home (set above), its SQLite metadata DB migrated, with a dags folder."""
    home = Path(os.environ["AIRFLOW_HOME"])
    result = subprocess.run([AIRFLOW, "db", "migrate"], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (home / "dags").mkdir(exist_ok=True)
    return home


_SHARED_NODES: list[DevServer] = []


@pytest.fixture(scope="session")
def liftbridge_server(liftbridge_server: DevServer) -> DevServer:
    """The session's single node (liftbridge_provider.devserver.pytest_plugin), noted so that each module's
    streams on it can be deleted when the module ends (:func:`module_streams_deleted`)."""
    _SHARED_NODES.append(liftbridge_server)
    return liftbridge_server


@pytest.fixture(scope="module", autouse=True)
def module_streams_deleted() -> Iterator[None]:
    """The streams a test module made on the session's node are deleted after its last test.

    A node's idle CPU grows with its partitions (each leader runs its own timers): the hundreds of streams a
    worker's modules leave behind took a large share of the 2-CPU machine by the end of a run. Each xdist
    worker has its own node and runs its modules one after another, and no session-wide fixture makes
    streams, so what a module made is its own. Streams that were there before the module are kept.
    """
    before = _stream_names() if _SHARED_NODES else set()
    yield
    if not _SHARED_NODES:
        return
    with LiftbridgeClient(_SHARED_NODES[0].brokers) as tidy:
        for name in _stream_names() - before:
            if not name.startswith("__"):  # __cursors and __activity belong to the server
                with contextlib.suppress(NoSuchStreamError):
                    tidy.delete_stream(name)


def _stream_names() -> set[str]:
    with LiftbridgeClient(_SHARED_NODES[0].brokers) as look:
        return set(look.fetch_metadata().streams)


@pytest.fixture(autouse=True)
def no_hung_brokers() -> None:
    """Each test starts with no broker suspected: the health model is process-wide, and the cluster fixture's
    addresses are shared, so a broker frozen by one test would otherwise go last in the next."""
    HEALTH.clear()


@pytest.fixture(scope="module")
def node(liftbridge_server: DevServer) -> DevServer:
    """The node a module's ``client`` talks to: the session's single node unless the module overrides this."""
    return liftbridge_server


@pytest.fixture(scope="module")
def client(node: DevServer) -> Iterator[LiftbridgeClient]:
    """One client per module on ``node``, closed after the module's last test."""
    with LiftbridgeClient(node.brokers) as shared:
        yield shared
