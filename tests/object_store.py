"""Object-storage fixtures: a real S3 server per test session (per xdist worker), fresh buckets, S3A for Spark.

A pytest plugin of tests/conftest.py. Each test process makes its own root keys when it starts and puts
them in its environment (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``) before any Spark JVM starts:
S3A reads them there (``EnvironmentVariableCredentialsProvider``), in the shared session's JVM and in every
``spark-submit`` a test starts, so no key is in a Spark setting or on a command line, and no developer's
real AWS keys reach a test. The gateway the ``s3_server`` fixture starts takes the same keys.

- ``s3_server``: Versity's S3 gateway on 127.0.0.1 for the session (``liftbridge_provider.devserver.s3``).
- ``s3_settings``: its :class:`~liftbridge_provider.core.object_store.S3Settings`, the one source of the
  endpoint and keys: ``spark_conf()``, ``hadoop_conf()``, ``pyarrow_options()``,
  ``delta_storage_options()``, ``pyiceberg_properties()``, ``environment()``.
- ``s3_bucket``: a new bucket for one test; ``s3_module_bucket``: one for a test module (a PUT each).
- ``s3a_spark``: the shared ``local[2]`` session (tests/spark_session.py, which loads the S3A jars) with the
  gateway's S3A settings in its Hadoop configuration.
- :func:`s3a_submit_options`: the ``spark-submit`` options for S3A on the gateway (jars and settings).

Nothing is skipped: a missing gateway binary or jar folder fails the test, saying to run ``make tools``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from liftbridge_provider.core.object_store import S3Settings
from liftbridge_provider.devserver.s3 import S3Server, s3a_jars, start_s3

ROOT_KEYS = S3Settings(endpoint=None, access_key=f"lbtest{secrets.token_hex(8)}", secret_key=secrets.token_hex(20))
"""This test process's S3 root keys (one process: one xdist worker, or the whole run without xdist)."""


def pytest_configure() -> None:
    """Put this process's keys in its environment before the first Spark JVM starts (they read it once)."""
    os.environ.update(ROOT_KEYS.environment())
    os.environ.pop("AWS_SESSION_TOKEN", None)  # a developer's token would be sent along with the test keys


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """Versity's S3 gateway on 127.0.0.1 for the session, with this process's root keys."""
    with start_s3(
        data_dir=tmp_path_factory.mktemp("s3"), access_key=ROOT_KEYS.access_key, secret_key=ROOT_KEYS.secret_key
    ) as server:
        yield server


@pytest.fixture(scope="session")
def s3_settings(s3_server: S3Server) -> S3Settings:
    """The gateway's endpoint and keys, for every consumer's settings."""
    return s3_server.settings


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A new, empty bucket for this test."""
    return s3_server.create_bucket()


@pytest.fixture(scope="module")
def s3_module_bucket(s3_server: S3Server) -> str:
    """A new bucket shared by this test module's tests."""
    return s3_server.create_bucket()


@pytest.fixture(scope="session")
def s3a_spark(spark: SparkSession, s3_settings: S3Settings) -> SparkSession:
    """The shared session, its Hadoop configuration pointed at the gateway (S3A filesystems made from now on
    use it; a bucket's filesystem is made at its first use). Fails when the session started without the
    S3A jars (``make tools`` fetches them; tests/spark_session.py adds them when the session starts)."""
    jars = spark.sparkContext.getConf().get("spark.jars", "")
    if "hadoop-aws-" not in jars:
        s3a_jars()  # raises, saying how to fetch them, when they are missing
        pytest.fail(f"the shared Spark session started without the S3A jars (spark.jars={jars!r})")
    conf = spark._jsc.hadoopConfiguration()
    for key, value in s3_settings.hadoop_conf().items():
        conf.set(key, value)
    return spark


def s3a_submit_options(settings: S3Settings) -> list[str]:
    """``spark-submit`` options for S3A on ``settings``'s store: ``--jars`` and a ``--conf`` per setting.
    The keys are not among them: the process's environment carries them (:data:`ROOT_KEYS`)."""
    options = ["--jars", ",".join(str(jar) for jar in s3a_jars())]
    for key, value in settings.spark_conf().items():
        options += ["--conf", f"{key}={value}"]
    return options
