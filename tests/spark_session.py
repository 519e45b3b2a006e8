"""The local SparkSession the tests share: two cores on loopback, no UI, two shuffle partitions.

Starting a JVM and warming its Python workers takes seconds, so the whole test session (each xdist worker)
shares one ``local[2]`` session through the ``spark`` fixture, stopped when the session ends; no test or
fixture stops it earlier. Tests that need a driver of their own (a killed driver, packaging, a standalone
cluster) run ``spark-submit`` instead.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from liftbridge_provider.devserver import DevServerError
from liftbridge_provider.devserver.s3 import s3a_jars


def local_spark(app_name: str) -> SparkSession:
    """A ``local[2]`` session bound to 127.0.0.1 (or the one already running), with the S3A jars when
    ``make tools`` fetched them (tests/object_store.py: the ``s3a_spark`` fixture fails without them; jars
    cannot be added to a running driver, and a second session per worker would cost a JVM)."""
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    with contextlib.suppress(DevServerError):
        builder = builder.config("spark.jars", ",".join(str(jar) for jar in s3a_jars()))
    return builder.getOrCreate()


APP_NAME = "liftbridge-tests"
_seen = {"first test": False}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the first test of a session that will use the ``spark`` fixture, start the session.

    pyspark launches the JVM with a fork that runs Python code in the child
    (``preexec_fn``); a fork while gRPC's threads run can kill that child ("Java
    gateway process exited before sending its port number", docs/airflow.md,
    "Forked processes and gRPC"). A test that reads through a client (gRPC)
    before this worker's first Spark test would make every Spark test of the
    worker fail, so the JVM comes first, whatever order the tests run in.
    """
    if _seen["first test"]:
        return
    _seen["first test"] = True
    if any("spark" in getattr(other, "fixturenames", ()) for other in item.session.items):
        local_spark(APP_NAME)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_spark(APP_NAME)
    yield session
    session.stop()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop a session started for tests this worker did not run (the fixture stops its own)."""
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
