"""Fixtures of the Spark tier: one local SparkSession for the whole session.

Starting a JVM and warming its Python workers takes seconds, so every module of the tier shares one
``local[2]`` session (``tests/spark_session.py``); it is stopped when the test session ends. Tests that need
a driver of their own (a killed driver, packaging, a standalone cluster) run ``spark-submit`` instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from tests.spark_session import local_spark


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_spark("liftbridge-tests")
    yield session
    session.stop()
