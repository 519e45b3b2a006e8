"""Spark SQL settings a lake write needs, set on its SparkSession only while such writes run.

The ingest jobs run in the caller's SparkSession (the job's own under
``spark-submit``, a test's or a notebook's otherwise), and one process may
drive several sessions (``SparkSession.newSession()`` shares the SparkContext
and has a SQL conf of its own). So the settings are counted per session: the
first write of a session sets them on that session, and the session's own
values are put back when its last write ends (writes of a session may
overlap; writes of other sessions neither see nor undo them). Until issue 50
they were counted per process: a write of a second session that overlapped
one of the first ran without them (its Delta and Iceberg files held INT96
timestamps), and the first session's own values were never put back
(tests/spark/test_session_settings.py).

A session is known by its JVM session's ``sessionUUID``, not by the Python
object: PySpark makes a new ``SparkSession`` object for the same JVM session
now and then (``SparkSession.getActiveSession()``).

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
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

CONCURRENT_WRITERS = 2
"""Files a task of a partitioned lake write keeps open at once before Spark falls back to sorting its rows
(each open Parquet file buffers up to a row group in memory)."""


@dataclass
class _Held:
    """One session's running writes, and its values from before the first of them (None: unset)."""

    before: dict[str, str | None] = field(default_factory=dict)
    writes: int = 0


def session_key(spark: SparkSession) -> str:
    """The JVM session's identity: the same for every Python object of one session, different per session."""
    return str(spark._jsparkSession.sessionUUID())


class SessionSettings:
    """``settings`` set on a session while any write under :meth:`__call__` in that session runs; that
    session's values from before put back (or unset) when its last one ends. Thread-safe: one lock guards
    the count and the session's conf changes, so a write never starts between a restore's check and its
    changes."""

    def __init__(self, settings: Mapping[str, str]) -> None:
        self._settings = dict(settings)
        self._lock = threading.Lock()
        self._sessions: dict[str, _Held] = {}

    @contextmanager
    def __call__(self, spark: SparkSession) -> Iterator[None]:
        key = session_key(spark)
        with self._lock:
            held = self._sessions.get(key)
            if held is None:
                held = self._sessions[key] = _Held({name: spark.conf.get(name, None) for name in self._settings})
                for name, value in self._settings.items():
                    spark.conf.set(name, value)
            held.writes += 1
        try:
            yield
        finally:
            with self._lock:
                held.writes -= 1
                if held.writes == 0:
                    del self._sessions[key]
                    for name, before in held.before.items():
                        if before is None:
                            spark.conf.unset(name)
                        else:
                            spark.conf.set(name, before)


micros_timestamps = SessionSettings({"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"})
unsorted_partitioned_writes = SessionSettings({"spark.sql.maxConcurrentOutputFileWriters": str(CONCURRENT_WRITERS)})
