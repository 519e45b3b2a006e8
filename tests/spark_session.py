"""The local SparkSession the tests share: two cores on loopback, no UI, two shuffle partitions.

Starting a JVM and warming its Python workers takes seconds, so the whole test session (each xdist worker)
shares one ``local[2]`` session through the ``spark`` fixture, stopped when the session ends; no test or
fixture stops it earlier. Tests that need a driver of their own (a killed driver, packaging, a standalone
cluster) run ``spark-submit`` instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession


def local_spark(app_name: str) -> SparkSession:
    """A ``local[2]`` session bound to 127.0.0.1 (or the one already running)."""
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    return (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_spark("liftbridge-tests")
    yield session
    session.stop()
