"""The JVM options of the tests' Spark drivers, with a class-data-sharing archive of Spark's classes.

The suite starts many Spark driver JVMs (the shared sessions, each ``spark-submit``, the ones Airflow's
operator and the demo start), and each one loaded and verified the same thousands of classes from Spark's
jars (docs/benchmarks.md, "The test suite's time", has the measurement). ``make test`` runs
``python -m tests.spark_classes`` first: one small Spark job under ``-XX:ArchiveClassesAtExit`` writes the
classes it loaded to ``<venv>/spark-classes.jsa`` (HotSpot's dynamic CDS archive, JDK 13+), and :func:`jvm_options` adds
``-XX:SharedArchiveFile`` for it, so every later driver maps those classes instead of loading them. Same
Spark, same code paths: the archive changes how classes are loaded, not which ones.

HotSpot checks the archive against the JVM and the jars on the class path when it starts and runs
without it on any mismatch (another PySpark, an added ``--driver-class-path``); the JVM's CDS log is off,
so that fallback prints nothing into the outputs the tests read. Without the archive (``pytest`` run
without ``make``), the options are the same minus the archive.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

# The tests' JVMs (the shared session, each spark-submit and what Airflow's spark-submit starts, a standalone
# master and worker) compile with C1 only and collect with one thread: each lives seconds to minutes over
# thousands of rows, too short for C2's optimised code to pay for its compiling, and the machine is CPU-bound
# (docs/benchmarks.md, "The test suite's time"). Users' JVMs keep the defaults.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
ARCHIVE = Path(sys.prefix) / "spark-classes.jsa"
_QUIET = "-Xlog:cds=off,cds+dynamic=off"

# What the archive is made from: a session that plans and reads a Python data source, runs Python workers,
# writes and reads a partitioned Parquet folder, as the ingest job and the tests do.
_JOB = """
import sys
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition


class Numbers(DataSource):
    @classmethod
    def name(cls):
        return "numbers"

    def schema(self):
        return "partition int, offset long, value binary"

    def reader(self, schema):
        return NumbersReader()


class NumbersReader(DataSourceReader):
    def partitions(self):
        return [InputPartition(p) for p in range(2)]

    def read(self, partition):
        for offset in range(100):
            yield (partition.value, offset, b"v")


spark = SparkSession.builder.appName("spark-classes").getOrCreate()
spark.dataSource.register(Numbers)
frame = spark.read.format("numbers").load()
frame.write.mode("overwrite").partitionBy("partition").parquet(sys.argv[1])
assert spark.read.parquet(sys.argv[1]).count() == 200
assert spark.sparkContext.parallelize(range(4), 2).map(lambda n: n + 1).sum() == 10
spark.stop()
"""


def jvm_options() -> str:
    """The options of the tests' JVMs (``SPARK_SUBMIT_OPTS``, ``SPARK_DAEMON_JAVA_OPTS``):
    :data:`TEST_JVM_OPTIONS`, and the archive once made."""
    if not ARCHIVE.is_file():
        return TEST_JVM_OPTIONS
    return f"{TEST_JVM_OPTIONS} -XX:SharedArchiveFile={ARCHIVE} {_QUIET}"


def make_archive() -> None:
    """Run the job above with ``-XX:ArchiveClassesAtExit`` and move the archive in place when it is whole."""
    spark_submit = Path(sys.executable).with_name("spark-submit")
    partial = ARCHIVE.with_name(f"{ARCHIVE.stem}.{os.getpid()}.partial")
    try:
        with tempfile.TemporaryDirectory(prefix="spark-classes-") as folder:
            job = Path(folder) / "job.py"
            job.write_text(textwrap.dedent(_JOB))
            env = {
                **os.environ,
                "SPARK_LOCAL_IP": "127.0.0.1",
                "PYSPARK_PYTHON": sys.executable,
                "SPARK_SUBMIT_OPTS": f"{TEST_JVM_OPTIONS} -XX:ArchiveClassesAtExit={partial} {_QUIET}",
            }
            command = [str(spark_submit), "--master", "local[2]", "--conf", "spark.ui.enabled=false"]
            result = subprocess.run(
                [*command, str(job), str(Path(folder) / "out")],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
        if result.returncode != 0 or not partial.is_file():
            raise SystemExit(f"making {ARCHIVE} failed:\n{(result.stdout + result.stderr)[-3000:]}")
        os.replace(partial, ARCHIVE)
    finally:
        partial.unlink(missing_ok=True)
    print(f"made {ARCHIVE} ({ARCHIVE.stat().st_size // 2**20} MiB)")


if __name__ == "__main__":
    make_archive()
