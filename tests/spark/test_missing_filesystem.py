"""An object-store output whose filesystem Spark cannot load is refused first, naming what to add.

Without hadoop-aws and the AWS SDK, ``--output s3a://...`` used to end the ingest job in a raw
``Py4JJavaError`` (``ClassNotFoundException: org.apache.hadoop.fs.s3a.S3AFileSystem``) from
``getFileSystem``. Now the job checks the output's filesystem class before it asks Liftbridge anything or
claims anything, and says which jars (the ``--packages`` line) and settings to add. The job runs here as a
user runs it: ``spark-submit`` of spark_jobs/ingest.py, without the S3A jars.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from liftbridge_provider.core.object_store import S3A_PACKAGES, MissingFileSystemError
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.spark.object_store import check_output_filesystem

ROOT = Path(__file__).resolve().parents[2]
INGEST = ROOT / "spark_jobs" / "ingest.py"
SPARK_SUBMIT = str(Path(sys.executable).with_name("spark-submit"))


def test_the_job_without_the_s3a_jars_names_them_before_anything_else(tmp_path: Path) -> None:
    ranges = RangesDocument("orders", (OffsetRange(0, 0, 10),))
    command = [
        SPARK_SUBMIT, "--master", "local[1]", "--conf", f"spark.pyspark.python={sys.executable}",
        "--conf", "spark.ui.enabled=false", str(INGEST),
        "--brokers", "127.0.0.1:1",  # nothing listens there: asking Liftbridge first would fail differently
        "--ranges", ranges.dumps(), "--output", "s3a://lake-bucket/lake",
    ]  # fmt: skip
    environment = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert "ERROR liftbridge.ingest: s3a://lake-bucket/lake: Spark cannot load the s3a:// filesystem" in output
    assert "--packages " + ",".join(S3A_PACKAGES) + " --exclude-packages software.amazon.awssdk:bundle" in output
    assert "spark.hadoop.fs.s3a.endpoint" in output
    assert "Nothing was claimed or written" in output
    assert "Py4JJavaError" not in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "127.0.0.1:1" not in output  # Liftbridge was never asked


@pytest.mark.parametrize(
    ("output", "names"),
    [
        ("gs://bucket/lake", "org.apache.hadoop:hadoop-gcp:3.5.0"),
        ("abfss://lake@account.dfs.core.windows.net/lake", "org.apache.hadoop:hadoop-azure:3.5.0"),
        ("abfs://lake@account.dfs.core.windows.net/lake", "org.apache.hadoop:hadoop-azure:3.5.0"),
        ("s3://bucket/lake", "spark.hadoop.fs.s3.impl=org.apache.hadoop.fs.s3a.S3AFileSystem"),
    ],
)
def test_each_object_store_scheme_is_checked(spark: SparkSession, output: str, names: str) -> None:
    with pytest.raises(MissingFileSystemError) as refused:
        check_output_filesystem(spark, output)
    assert names in str(refused.value)
    assert str(refused.value).startswith(f"{output}: Spark cannot load the ")


@pytest.mark.parametrize("output", ["s3a://bucket/lake", "file:/tmp/lake", "/tmp/lake", "lake", "hdfs://nn/lake"])
def test_what_this_spark_can_load_passes(spark: SparkSession, output: str) -> None:
    """The tests' session has the S3A jars (tests/spark_session.py); hdfs and local files are Spark's own."""
    check_output_filesystem(spark, output)
