"""The ingest job's one source of S3 settings, on its Spark session: S3A's settings, as delta-rs and pyiceberg
need them too.

- :func:`use_aws_connection`: an Airflow ``aws`` connection handed to the job in ``LIFTBRIDGE_AWS_CONN_JSON``
  (``hooks/object_store.py``) becomes the session's S3A settings, keys included
  (``core/s3_sources.py``: ``s3a_conf_with_keys``). They are set on the session's Hadoop configuration at run
  time, before the job's first S3A filesystem: S3A filesystems and Spark's tasks read them there (a write's
  tasks get the driver's Hadoop configuration with the job), and no Spark setting, command line, UI page or
  event log shows them.
- :func:`session_s3_settings`: what S3A uses for a bucket, read from the session's Hadoop configuration and
  the environment S3A reads (``core/s3_sources.py``: ``settings_from_s3a``), for delta-rs's
  ``storage_options`` and pyiceberg's FileIO.

So S3A, delta-rs and pyiceberg always sign with the same keys against the same endpoint, whichever way the
user gave them. PySpark has no public handle on the Hadoop configuration: the session's JVM context is
reached the way ``spark/lake_store.py`` and ``spark/object_store.py`` reach it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pyspark.sql import SparkSession

from liftbridge_provider.core.object_store import S3Settings
from liftbridge_provider.core.s3_sources import (
    AWS_CONNECTION_ENV,
    s3_location,
    s3a_conf_with_keys,
    s3a_keys,
    settings_from_aws_connection_json,
    settings_from_s3a,
)

log = logging.getLogger("liftbridge.ingest.s3")


def _hadoop_conf(spark: SparkSession) -> Any:
    return spark._jsc.hadoopConfiguration()  # no public handle (see the module docstring)


def use_aws_connection(spark: SparkSession, environ: Mapping[str, str]) -> bool:
    """Set ``spark``'s S3A settings from the ``aws`` connection in ``environ[LIFTBRIDGE_AWS_CONN_JSON]``; False
    (nothing set) when there is none. InvalidArgumentError for a connection that cannot be mapped."""
    return apply_aws_connection(_hadoop_conf(spark), environ)


def apply_aws_connection(conf: Any, environ: Mapping[str, str]) -> bool:
    """:func:`use_aws_connection` on a Hadoop configuration (the driver's, before any session: ``spark/landed.py``)."""
    text = environ.get(AWS_CONNECTION_ENV)
    if not text:
        return False
    settings = settings_from_aws_connection_json(text)
    for key, value in s3a_conf_with_keys(settings).items():
        conf.set(key, value)
    log.info(
        "S3 settings from the aws connection in %s: endpoint %s, region %s, %s-style addressing (S3A, delta-rs "
        "and pyiceberg use them)",
        AWS_CONNECTION_ENV,
        settings.endpoint or "AWS",
        settings.region,
        "path" if settings.path_style else "virtual-host",
    )
    return True


def session_s3_settings(spark: SparkSession, uri: str, environ: Mapping[str, str]) -> S3Settings | None:
    """The S3 settings S3A uses for ``uri``'s bucket on ``spark`` (None when ``uri`` is not on S3);
    InvalidArgumentError when they name no keys delta-rs and pyiceberg could use."""
    return conf_s3_settings(_hadoop_conf(spark), uri, environ)


def conf_s3_settings(conf: Any, uri: str, environ: Mapping[str, str]) -> S3Settings | None:
    """:func:`session_s3_settings` from a Hadoop configuration (the driver's, before any session)."""
    location = s3_location(uri)
    if location is None:
        return None
    bucket = location[0]
    values = {key: str(value) for key in s3a_keys(bucket) if (value := conf.get(key)) is not None}
    return settings_from_s3a(values, environ, bucket)


ENCRYPTION_OPTIONS = ("encryption.algorithm", "server-side-encryption-algorithm")
"""S3A's settings that make it encrypt what it writes (SSE-S3, SSE-KMS, SSE-C, CSE; the second is the older
name), per bucket or for all."""


def s3a_encrypts(spark: SparkSession, bucket: str) -> bool:
    """Whether S3A encrypts what it writes to ``bucket`` on ``spark``: then only S3A writes there (pyarrow is
    not given S3A's encryption settings)."""
    conf = _hadoop_conf(spark)
    return any((conf.get(key) or "").strip() for key in s3a_keys(bucket, ENCRYPTION_OPTIONS))
