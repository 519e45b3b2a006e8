"""The local SparkSession the tests share: two cores on loopback, no UI, two shuffle partitions."""

from __future__ import annotations

import os

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
