"""The ``liftbridge`` Spark source on this PySpark: a batch read and streaming queries read every offset once.

Small data (a few hundred messages on three partitions): what differs between
PySpark versions is how Spark drives the reader, not the volume. PySpark 4.0 and
4.1 have no admission control for Python sources, so the reader caps each
micro-batch itself (``maxOffsetsPerTrigger``) and an ``availableNow`` query is one
micro-batch; 4.2+ hands the reader its limit and reads ``availableNow`` in capped
micro-batches.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from liftbridge_provider.client import LiftbridgeClient, PublishMessage
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.version_compat import PYSPARK_V_4_1_PLUS, PYSPARK_V_4_2_PLUS

pytestmark = pytest.mark.spark_target
PARTITIONS = 3


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = (
        SparkSession.builder.master("local[2]")
        .appName("liftbridge-compat")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture
def client(liftbridge_server: DevServer) -> Iterator[LiftbridgeClient]:
    with LiftbridgeClient(liftbridge_server.brokers) as shared:
        yield shared


def new_stream(client: LiftbridgeClient) -> str:
    name = f"compat-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name, partitions=PARTITIONS)
    return name


def publish(client: LiftbridgeClient, stream: str, first: int, count: int) -> None:
    batch = [PublishMessage(f"m{n}".encode(), partition=n % PARTITIONS) for n in range(first, first + count)]
    client.publish_batch(stream, batch, ack_policy="all")


def expected(first: int, count: int) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of messages first .. first + count - 1 published by :func:`publish`."""
    return sorted((n % PARTITIONS, n // PARTITIONS, f"m{n}".encode()) for n in range(first, first + count))


def read_back(spark: SparkSession, output: Path) -> list[tuple[int, int, bytes]]:
    """The sink's rows (none while its log lists no file yet)."""
    try:
        rows = spark.read.parquet(str(output)).select("partition", "offset", "value").collect()
    except AnalysisException as exc:  # "Unable to infer schema": no file committed yet
        if "infer schema" not in str(exc) and "PATH_NOT_FOUND" not in str(exc):
            raise
        return []
    return sorted((r.partition, r.offset, bytes(r.value)) for r in rows)


def test_a_batch_read_returns_every_message_once(spark: SparkSession, liftbridge_server: DevServer,
                                                 client: LiftbridgeClient) -> None:  # fmt: skip
    """spark.read.format("liftbridge") of a whole stream: each message once, with its partition, offset and
    value, and timestamps as Spark's UTC timestamps (the Arrow schema this PySpark expects)."""
    stream = new_stream(client)
    publish(client, stream, 0, 300)
    frame = (
        spark.read.format("liftbridge")
        .option("brokers", ",".join(liftbridge_server.brokers))
        .option("stream", stream)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    rows = frame.select("partition", "offset", "value", "timestamp").collect()
    assert sorted((r.partition, r.offset, bytes(r.value)) for r in rows) == expected(0, 300)
    assert all(r.timestamp is not None for r in rows)


def test_spark_workers_import_the_installed_package(spark: SparkSession) -> None:
    """Spark's Python workers import the package from the environment (the wheel), not from a checkout."""
    import liftbridge_provider  # noqa: PLC0415 - the path it was imported from

    def where(_: Any) -> str:
        import liftbridge_provider  # noqa: PLC0415 - imported in the worker

        return liftbridge_provider.__file__ or ""

    assert spark.sparkContext.parallelize([0], 1).map(where).collect() == [liftbridge_provider.__file__]


def start_query(spark: SparkSession, brokers: list[str], stream: str, tmp: Path, trigger: dict[str, Any],
                **options: str) -> Any:  # fmt: skip
    frame = (
        spark.readStream.format("liftbridge")
        .option("brokers", ",".join(brokers))
        .option("stream", stream)
        .option("startingOffsets", "earliest")
    )
    return (
        frame.options(**options)
        .load()
        .writeStream.format("parquet")
        .option("path", str(tmp / "out"))
        .option("checkpointLocation", str(tmp / "checkpoint"))
        .trigger(**trigger)
        .start()
    )


def wait_for_rows(spark: SparkSession, query: Any, output: Path, count: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert query.exception() is None, query.exception()
        if len(read_back(spark, output)) >= count:
            return
        time.sleep(1)
    raise AssertionError(f"fewer than {count} rows after {timeout:g}s: {query.recentProgress[-3:]}")


def batch_sizes(queries: list[Any]) -> list[int]:
    return [p["numInputRows"] for q in queries for p in q.recentProgress if p["numInputRows"]]


def test_a_processing_time_query_caps_micro_batches_and_resumes_exactly(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    """readStream with maxOffsetsPerTrigger=60 under a processing-time trigger: no micro-batch reads more than
    60 offsets, every message lands once, and a query started again from its checkpoint reads only what
    came later (on every PySpark: 4.0/4.1 through the reader's own cap, 4.2+ through admission control)."""
    stream = new_stream(client)
    publish(client, stream, 0, 300)
    first = start_query(spark, liftbridge_server.brokers, stream, tmp_path, {"processingTime": "1 second"},
                        maxOffsetsPerTrigger="60")  # fmt: skip
    try:
        wait_for_rows(spark, first, tmp_path / "out", 300)
    finally:
        first.stop()
    publish(client, stream, 300, 90)
    second = start_query(spark, liftbridge_server.brokers, stream, tmp_path, {"processingTime": "1 second"},
                         maxOffsetsPerTrigger="60")  # fmt: skip
    try:
        wait_for_rows(spark, second, tmp_path / "out", 390)
    finally:
        second.stop()
    assert read_back(spark, tmp_path / "out") == expected(0, 390)
    sizes = batch_sizes([first, second])
    assert sizes, "no micro-batch read anything"
    assert max(sizes) <= 60, sizes
    assert sum(sizes) == 390, sizes


def test_an_available_now_query_reads_what_was_there_exactly(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    """trigger(availableNow=True) reads every message there when it starts, once, and a second run only the
    later ones. With maxOffsetsPerTrigger, PySpark 4.2+ reads them all in capped micro-batches; 4.0/4.1 (no
    admission control) read one capped micro-batch per run, and the next run goes on from the checkpoint."""
    stream = new_stream(client)
    publish(client, stream, 0, 240)
    runs, total = 0, 0
    while total < 240 and runs < 10:
        query = start_query(spark, liftbridge_server.brokers, stream, tmp_path, {"availableNow": True},
                            maxOffsetsPerTrigger="90")  # fmt: skip
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()
        runs += 1
        sizes = batch_sizes([query])
        assert all(size <= 90 for size in sizes), sizes
        total = len(read_back(spark, tmp_path / "out"))
    assert read_back(spark, tmp_path / "out") == expected(0, 240)
    assert runs == (1 if PYSPARK_V_4_2_PLUS else 3), runs
    publish(client, stream, 240, 30)
    query = start_query(spark, liftbridge_server.brokers, stream, tmp_path, {"availableNow": True})
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    assert read_back(spark, tmp_path / "out") == expected(0, 270)


def test_the_sink_writes_a_batch_and_a_stream_where_pyspark_can(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    """df.write.format("liftbridge") publishes every row on any PySpark; writeStream does on 4.1+ and is
    refused on 4.0 (no Arrow stream writer) with a message naming the version."""
    stream, brokers = new_stream(client), ",".join(liftbridge_server.brokers)
    rows = [(f"v{n}".encode(), n % PARTITIONS) for n in range(30)]
    frame = spark.createDataFrame(rows, "value binary, partition int")
    frame.write.format("liftbridge").option("brokers", brokers).option("stream", stream).mode("append").save()
    published = sorted(m.value for p in range(PARTITIONS) for m in client.read_range(stream, p, 0, 10))
    assert published == sorted(f"v{n}".encode() for n in range(30))
    source = spark.readStream.format("liftbridge").option("brokers", brokers).option("stream", stream)
    copy = new_stream(client)
    writer = (
        source.option("startingOffsets", "earliest")
        .load()
        .select("value", "partition")
        .writeStream.format("liftbridge")
        .option("brokers", brokers)
        .option("stream", copy)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
    )
    if not PYSPARK_V_4_1_PLUS:
        with pytest.raises(Exception, match=r"needs PySpark 4\.1\+"):
            writer.start().awaitTermination(120)
        return
    query = writer.start()
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    copied = sorted(m.value for p in range(PARTITIONS) for m in client.read_range(copy, p, 0, 10))
    assert copied == published
