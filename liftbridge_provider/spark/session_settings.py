"""Spark SQL settings a lake write needs, set on the session only while such writes run.

The ingest jobs run in the caller's SparkSession (the job's own under
``spark-submit``, a test's or a notebook's otherwise), so a setting one write
needs is set when the first such write of this process starts and the
session's own value is put back when the last one ends (writes may overlap).

- :data:`micros_timestamps`: Delta's and Iceberg's timestamp is microseconds;
  Spark writes INT96 by default.
- :data:`unsorted_partitioned_writes`: a write with ``partitionBy`` makes
  Spark sort each task's rows by the partition columns first, since it cannot
  know that they already agree. Every task of an ingest job reads one piece
  of one partition, so its rows hold one set of partition values and the sort
  only copies every row once more. With concurrent output writers on, Spark
  plans no sort: a task writes its rows as they come, to one open file per
  set of partition values it meets; past :data:`CONCURRENT_WRITERS` sets,
  Spark sorts the rest of that task's rows as before. The files and their
  rows are the same either way.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from pyspark.sql import SparkSession

CONCURRENT_WRITERS = 2
"""Files a task of a partitioned lake write keeps open at once before Spark falls back to sorting its rows
(each open Parquet file buffers up to a row group in memory)."""


class SessionSettings:
    """``settings`` set on the session while any write under :meth:`__call__` of this process runs; the
    session's values from before put back (or unset) when the last one ends."""

    def __init__(self, settings: Mapping[str, str]) -> None:
        self._settings = dict(settings)
        self._lock = threading.Lock()
        self._writes = 0
        self._before: dict[str, str | None] = {}

    @contextmanager
    def __call__(self, spark: SparkSession) -> Iterator[None]:
        with self._lock:
            if self._writes == 0:
                self._before = {key: spark.conf.get(key, None) for key in self._settings}
                for key, value in self._settings.items():
                    spark.conf.set(key, value)
            self._writes += 1
        try:
            yield
        finally:
            with self._lock:
                self._writes -= 1
                if self._writes == 0:
                    for key, before in self._before.items():
                        if before is None:
                            spark.conf.unset(key)
                        else:
                            spark.conf.set(key, before)


micros_timestamps = SessionSettings({"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"})
unsorted_partitioned_writes = SessionSettings({"spark.sql.maxConcurrentOutputFileWriters": str(CONCURRENT_WRITERS)})
