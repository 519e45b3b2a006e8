"""The settings a lake write sets on its SparkSession hold per session, and each session gets its own back.

One process may drive several SparkSessions (``SparkSession.newSession()``
shares the SparkContext and has its own SQL conf: a notebook's, a test's, two
ingest runs of one driver). Until issue 50 the settings were counted per
process: a write in a second session that overlapped one in the first ran
without the microsecond-timestamp setting (its Delta and Iceberg files held
INT96 timestamps), and the first session's own values were never put back.
Real Spark ``local[2]``; the files are the Delta writer's own.
"""

from __future__ import annotations

import random
import threading
from contextlib import ExitStack
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from liftbridge_provider.spark.session_settings import micros_timestamps, unsorted_partitioned_writes

TIMESTAMPS = "spark.sql.parquet.outputTimestampType"
WRITERS = "spark.sql.maxConcurrentOutputFileWriters"


def rows(spark: SparkSession) -> DataFrame:
    """Rows with a timestamp and a partition column, as the ingest job writes them."""
    return spark.range(4).selectExpr("cast(id % 2 as int) as partition", "timestamp_micros(id) as timestamp")


def write_files(spark: SparkSession, frame: DataFrame, folder: Path) -> None:
    """Parquet files as the Delta and Iceberg writers write them: microsecond timestamps, one folder per
    partition, unsorted."""
    with micros_timestamps(spark), unsorted_partitioned_writes(spark):
        frame.write.partitionBy("partition").mode("errorifexists").parquet(folder.as_uri())


def timestamp_types(folder: Path) -> set[str]:
    """The Parquet physical types of the ``timestamp`` column in every data file under ``folder``."""
    files = list(folder.rglob("*.parquet"))
    assert files, f"no files under {folder}"
    types = set()
    for file in files:
        schema = pq.ParquetFile(file).schema
        types.add(schema.column(schema.names.index("timestamp")).physical_type)
    return types


def test_a_write_in_a_second_session_overlapping_one_in_the_first_writes_microsecond_timestamps(
    spark: SparkSession, tmp_path: Path
) -> None:
    """While a Delta or Iceberg write of the first session runs, one of a second session writes its files
    with microsecond timestamps (INT64), not Spark's INT96 default; both sessions keep their own values."""
    second = spark.newSession()
    spark.conf.set(TIMESTAMPS, "INT96")  # the first session's own value, set explicitly
    try:
        with micros_timestamps(spark):  # the first session's write is running
            write_files(second, rows(second), tmp_path / "second")
            assert spark.conf.get(TIMESTAMPS) == "TIMESTAMP_MICROS"
        assert timestamp_types(tmp_path / "second") == {"INT64"}, "the second session wrote INT96 timestamps"
        assert spark.conf.get(TIMESTAMPS) == "INT96", "the first session's own value came back"
        assert second.conf.get(TIMESTAMPS, None) is None, "the second session's own value (unset) came back"
        assert second.conf.get(WRITERS, None) is None
    finally:
        spark.conf.unset(TIMESTAMPS)


def test_each_session_gets_its_own_values_back_whichever_write_ends_last(spark: SparkSession) -> None:
    """The first session's write ends while the second's still runs: the first session's values come back
    then, and the second's when its write ends."""
    second = spark.newSession()
    spark.conf.set(WRITERS, "7")
    second.conf.set(WRITERS, "5")
    try:
        first_write, second_write = ExitStack(), ExitStack()
        first_write.enter_context(unsorted_partitioned_writes(spark))
        second_write.enter_context(unsorted_partitioned_writes(second))
        assert (spark.conf.get(WRITERS), second.conf.get(WRITERS)) == ("2", "2")
        first_write.close()
        assert spark.conf.get(WRITERS) == "7", "the first session's value was not put back"
        assert second.conf.get(WRITERS) == "2", "the second session's write still runs"
        second_write.close()
        assert (spark.conf.get(WRITERS), second.conf.get(WRITERS)) == ("7", "5")
    finally:
        spark.conf.unset(WRITERS)
        second.conf.unset(WRITERS)


def test_writes_on_many_threads_in_two_sessions_always_see_the_setting_and_leave_the_sessions_as_they_were(
    spark: SparkSession,
) -> None:
    """Threads enter and leave writes of both sessions in random order (sessions also reached through a new
    Python object for the same JVM session, as ``SparkSession.getActiveSession()`` may return): inside a
    write its session always has the setting; after the last one each session has its own value again."""
    second = spark.newSession()
    spark.conf.set(TIMESTAMPS, "INT96")
    sessions = [spark, second, SparkSession(spark.sparkContext, spark._jsparkSession)]
    seen: list[str] = []
    failures: list[BaseException] = []

    def writes(seed: int) -> None:
        chosen = random.Random(seed)
        try:
            for _ in range(15):
                session = chosen.choice(sessions)
                with micros_timestamps(session):
                    seen.append(str(session.conf.get(TIMESTAMPS)))
        except BaseException as exc:  # reported by the test, not lost in the thread
            failures.append(exc)

    try:
        threads = [threading.Thread(target=writes, args=(seed,)) for seed in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert len(seen) == 90
        assert set(seen) == {"TIMESTAMP_MICROS"}, "a write ran without the setting"
        assert spark.conf.get(TIMESTAMPS) == "INT96"
        assert second.conf.get(TIMESTAMPS, None) is None
    finally:
        spark.conf.unset(TIMESTAMPS)
