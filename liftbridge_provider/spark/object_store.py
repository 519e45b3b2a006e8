"""The ingest job's first check of an object-store output: can this Spark load the output's filesystem?

Without hadoop-aws and the AWS SDK on Spark's class path, an ``s3a://`` output used to end the job in a raw
``Py4JJavaError`` (``ClassNotFoundException: org.apache.hadoop.fs.s3a.S3AFileSystem``) from
``getFileSystem``. :func:`check_output_filesystem` asks Hadoop for the scheme's filesystem class
(``FileSystem.getFileSystemClass``, which loads it without connecting anywhere) before anything is claimed,
and raises :class:`~liftbridge_provider.core.object_store.MissingFileSystemError` naming the jars (the
``--packages`` line) and the settings to add (:data:`~liftbridge_provider.core.object_store.FILESYSTEMS`).
Other schemes (``file:``, ``hdfs:``, a plain path) are not checked: Spark's own jars hold them.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from liftbridge_provider.core.object_store import (
    FILESYSTEMS,
    MissingFileSystemError,
    missing_filesystem_message,
    scheme_of,
)


def check_output_filesystem(spark: SparkSession, output: str) -> None:
    """Return when ``output`` is not an object-store URI or Spark's JVM can load its Hadoop filesystem class;
    raise MissingFileSystemError saying what to add otherwise. Makes no request to the store."""
    scheme = scheme_of(output)
    if scheme not in FILESYSTEMS:
        return
    jvm: Any = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    try:
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, conf)
    except Exception as exc:  # py4j's Py4JJavaError: ClassNotFoundException, UnsupportedFileSystemException
        raise MissingFileSystemError(missing_filesystem_message(output, java_reason(exc))) from None


def java_reason(exc: Exception) -> str:
    """The innermost Java exception's class and message (``java.lang.ClassNotFoundException: Class ...``)."""
    java = getattr(exc, "java_exception", None)
    if java is None:
        return f"{type(exc).__name__}: {exc}"
    while java.getCause() is not None and java.getCause() != java:
        java = java.getCause()
    return f"{java.getClass().getName()}: {java.getMessage()}"
