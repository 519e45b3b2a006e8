"""spark.readStream and df.write with format("liftbridge"), against a real server and real Spark."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import BinaryType, IntegerType, LongType, MapType, StringType, StructField, StructType

from liftbridge_provider.client import LiftbridgeClient, PublishMessage
from liftbridge_provider.devserver import DevServer

ROOT = Path(__file__).resolve().parents[2]


def new_stream(client: LiftbridgeClient, partitions: int = 3, **options: Any) -> str:
    name = f"sst-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name, partitions=partitions, **options)
    return name


def publish(client: LiftbridgeClient, stream: str, count: int, first: int = 0, partitions: int = 3) -> None:
    batch = [PublishMessage(f"m{n}".encode(), partition=n % partitions) for n in range(first, first + count)]
    client.publish_batch(stream, batch, ack_policy="all")


def stream_query(
    spark: SparkSession, brokers: list[str], stream: str, output: Path, checkpoint: Path, **options: str
) -> Any:
    frame = spark.readStream.format("liftbridge").option("brokers", ",".join(brokers)).option("stream", stream)
    query = (
        frame.options(**options)
        .load()
        .writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    return query


def processing_query(brokers: list[str], stream: str, output: Path, checkpoint: Path, every: str) -> Any:
    """A query from the default start (latest) writing Parquet every ``every``, started and left running."""
    spark = SparkSession.getActiveSession()
    assert spark is not None
    frame = spark.readStream.format("liftbridge").option("brokers", ",".join(brokers)).option("stream", stream)
    return (
        frame.load()
        .writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=every)
        .start()
    )


def offsets_in(spark: SparkSession, output: Path) -> list[tuple[int, int]]:
    return sorted(
        (r.partition, r.offset) for r in spark.read.parquet(str(output)).select("partition", "offset").collect()
    )


def test_available_now_reads_what_was_there_in_rate_limited_micro_batches_and_resumes(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    stream = new_stream(client)
    publish(client, stream, 3000)  # 1,000 per partition
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = stream_query(
        spark,
        liftbridge_server.brokers,
        stream,
        output,
        checkpoint,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="700",
    )
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert [p["numInputRows"] for p in batches] == [700, 700, 700, 700, 200], "3,000 rows in batches of at most 700"
    assert json.loads(batches[-1]["sources"][0]["endOffset"]) == {"0": 1000, "1": 1000, "2": 1000}
    assert offsets_in(spark, output) == sorted((p, o) for p in range(3) for o in range(1000))
    publish(client, stream, 300, first=3000)  # the next run from the checkpoint reads only these
    again = stream_query(
        spark,
        liftbridge_server.brokers,
        stream,
        output,
        checkpoint,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="700",
    )
    assert sum(p["numInputRows"] for p in again.recentProgress) == 300
    assert offsets_in(spark, output) == sorted((p, o) for p in range(3) for o in range(1100))


def test_a_query_killed_mid_way_restarts_from_its_checkpoint_with_no_duplicate_and_no_gap(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    stream = new_stream(client)
    publish(client, stream, 3000)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    argv = [sys.executable, str(ROOT / "tests" / "spark" / "spark_scripts" / "stream_to_parquet.py")]
    argv += [",".join(liftbridge_server.brokers), stream, str(output), str(checkpoint), "150"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while len(list((checkpoint / "commits").glob("[0-9]*"))) < 4:
            assert first.poll() is None, (first.stdout.read() if first.stdout else b"")[-3000:]
            assert time.monotonic() < deadline, "the query made no progress"
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # mid-query: 4 of 20 micro-batches committed
        first.wait(30)
    done_before = len(list((checkpoint / "commits").glob("[0-9]*")))
    assert done_before < 20
    second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert offsets_in(spark, output) == sorted((p, o) for p in range(3) for o in range(1000)), "each offset once"


def test_commit_cursor_follows_the_committed_micro_batches(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    """The cursor moves to the end of each micro-batch the sink committed, the last one included (Spark tells
    the source of a commit only when it plans the next micro-batch; the reader also learns it from the next
    latestOffset), and never past what the sink committed."""
    stream = new_stream(client, partitions=2)
    publish(client, stream, 40, partitions=2)
    options = {"startingOffsets": "earliest", "maxOffsetsPerTrigger": "10", "commitCursorId": "spark-stream"}
    output, checkpoint = tmp_path / "out", tmp_path / "cp"
    stream_query(spark, liftbridge_server.brokers, stream, output, checkpoint, **options)
    assert [client.fetch_cursor("spark-stream", stream, p) for p in (0, 1)] == [19, 19]
    publish(client, stream, 4, first=40, partitions=2)
    stream_query(spark, liftbridge_server.brokers, stream, output, checkpoint, **options)  # from the checkpoint
    assert [client.fetch_cursor("spark-stream", stream, p) for p in (0, 1)] == [21, 21]


SINK_SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("value", BinaryType()),
        StructField("headers", MapType(StringType(), BinaryType())),
        StructField("partition", IntegerType()),
    ]
)


def read_back(spark: SparkSession, brokers: list[str], stream: str) -> list[tuple[Any, ...]]:
    frame = (
        spark.read.format("liftbridge")
        .option("brokers", ",".join(brokers))
        .option("stream", stream)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    return sorted(
        (r.partition, r.key, r.value, {k: v for k, v in r.headers.items() if k not in ("subject", "reply")})
        for r in frame.collect()
    )


def test_a_dataframe_written_to_a_stream_reads_back_the_same(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    stream = new_stream(client)
    rows = [(f"k{n}", f"v{n}".encode(), {"n": str(n).encode()}, n % 3 if n % 2 else None) for n in range(60)]
    frame = spark.createDataFrame(rows, SINK_SCHEMA).repartition(3)
    frame.write.format("liftbridge").option("brokers", ",".join(liftbridge_server.brokers)).option(
        "stream", stream
    ).option("batchSize", "7").mode("append").save()
    expected_partition = {n: (n % 3 if n % 2 else None) for n in range(60)}
    back = read_back(spark, liftbridge_server.brokers, stream)
    assert sorted((k, v, tuple(h.items())) for _, k, v, h in back) == sorted(
        (f"k{n}".encode(), f"v{n}".encode(), (("n", str(n).encode()),)) for n in range(60)
    )
    for partition, key, _, _ in back:
        n = int(key[1:])
        if expected_partition[n] is not None:
            assert partition == expected_partition[n], "a row's partition column decides"


def test_a_sink_task_that_fails_midway_says_what_was_acked(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    stream = new_stream(client, partitions=1)
    rows = [(None, b"x" * (2 * 1024 * 1024 if n == 5 else 10), None, 0) for n in range(8)]  # row 5: over 1 MiB
    frame = spark.createDataFrame(rows, SINK_SCHEMA).coalesce(1)
    writer = frame.write.format("liftbridge").option("brokers", ",".join(liftbridge_server.brokers))
    with pytest.raises(Exception, match=r"5 message\(s\) of this task were acked before it failed") as raised:
        writer.option("stream", stream).option("batchSize", "2").mode("append").save()
    assert "message of 2097" in str(raised.value)
    assert "over the server's size limit" in str(raised.value)
    # Batches [0, 1], [2, 3], then [4, 5]: 4 was acked, 5 refused; the task stopped there.
    assert client.fetch_partition_metadata(stream, 0).high_watermark == 4


def test_use_offsets_writes_each_row_once_across_repeats(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """Exactly once on an optimistic-concurrency stream: rows carry their expected offsets, so writing them
    again stores nothing twice (an earlier attempt's messages are recognised), and a row whose offset holds
    another message fails."""
    stream = new_stream(client, partitions=1, optimistic_concurrency_control=True)
    schema = StructType([*SINK_SCHEMA.fields, StructField("offset", LongType())])
    brokers = ",".join(liftbridge_server.brokers)

    def write(rows: list[tuple[Any, ...]]) -> None:
        spark.createDataFrame(rows, schema).coalesce(1).write.format("liftbridge").option("brokers", brokers).option(
            "stream", stream
        ).option("useOffsets", "true").mode("append").save()

    write([(f"k{o}", f"v{o}".encode(), None, 0, o) for o in range(10)])
    write([(f"k{o}", f"v{o}".encode(), None, 0, o) for o in range(10)])  # a repeat: nothing new
    write([(f"k{o}", f"v{o}".encode(), None, 0, o) for o in range(5, 15)])  # overlapping: 10-14 only
    assert [m.value for m in client.read_range(stream, 0, 0, 15)] == [f"v{o}".encode() for o in range(15)]
    assert client.fetch_partition_metadata(stream, 0).high_watermark == 14
    with pytest.raises(Exception, match=r"(?i)incorrect"):
        write([("k3", b"another", None, 0, 3)])


def test_bad_sink_frames_and_options_fail_on_the_driver(spark: SparkSession, liftbridge_server: DevServer) -> None:
    brokers = ",".join(liftbridge_server.brokers)
    no_value = spark.createDataFrame([("k",)], "key string")
    with pytest.raises(Exception, match="needs a value column"):
        no_value.write.format("liftbridge").option("brokers", brokers).option("stream", "s").mode("append").save()
    extra = spark.createDataFrame([(b"v", 1.5)], "value binary, price double")
    with pytest.raises(Exception, match="column 'price' cannot be written"):
        extra.write.format("liftbridge").option("brokers", brokers).option("stream", "s").mode("append").save()
    ok = spark.createDataFrame([(b"v",)], "value binary")
    with pytest.raises(Exception, match="partitioner must be key or round_robin"):
        ok.write.format("liftbridge").option("brokers", brokers).option("stream", "s").option(
            "partitioner", "random"
        ).mode("append").save()


def test_a_query_from_latest_on_a_stream_that_keeps_receiving_reads_what_comes_after_it_started(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    """The default start (latest) on a live stream: Spark asks for the initial offsets more than once for the
    first micro-batch, and each answer was the latest of that moment; a message published in between made
    the first batch start after its own end ("end 10 is before start 11") and the query failed, on every
    restart too. The first answer now holds for the query, and every message published after it is read."""
    stream = new_stream(client, partitions=1)
    publish(client, stream, 10, partitions=1)
    stop = threading.Event()
    published: list[int] = []

    def keep_publishing() -> None:
        with LiftbridgeClient(liftbridge_server.brokers) as own:
            while not stop.is_set():
                ack = own.publish(stream, f"live{len(published)}".encode(), ack_policy="all")
                assert ack is not None
                published.append(ack.offset)
                time.sleep(0.002)

    publisher = threading.Thread(target=keep_publishing, daemon=True)
    publisher.start()
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = processing_query(liftbridge_server.brokers, stream, output, checkpoint, "500 milliseconds")
    try:
        deadline = time.monotonic() + 120
        while sum(p["numInputRows"] for p in query.recentProgress) < 50 and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(0.5)
    finally:
        stop.set()
        publisher.join(timeout=10)
        query.stop()
    assert query.exception() is None, query.exception()
    read = [offset for _, offset in offsets_in(spark, output)]
    assert len(read) >= 50
    assert read == list(range(read[0], read[-1] + 1)), "no gap and no duplicate after the first offset read"
    assert read[0] >= 10, "latest: nothing published before the query started"


def test_a_first_micro_batch_restarted_before_it_committed_goes_on_from_its_end(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    """A query from latest stopped after its first micro-batch's offsets were checkpointed and before the
    batch (or its sink) committed: on restart Spark asks for the initial offsets again (it keeps none for a
    Python source), and "latest" is now past that batch's end, so the restarted query failed at once, and on
    every restart. It now runs the first batch from its end (what was published before that since the
    query first started is not read, as the warning says) and goes on with every later offset once."""
    stream = new_stream(client, partitions=1)
    publish(client, stream, 10, partitions=1)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start() -> Any:
        return processing_query(liftbridge_server.brokers, stream, output, checkpoint, "300 milliseconds")

    def wait_for_rows(query: Any, rows: int) -> None:
        deadline = time.monotonic() + 120
        while sum(p["numInputRows"] for p in query.recentProgress) < rows:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, f"no {rows} rows read"
            publish(client, stream, 5, first=0, partitions=1)
            time.sleep(0.3)

    first = start()
    wait_for_rows(first, 1)
    first.stop()
    for kind in ("commits", "offsets"):  # as if stopped right after the first batch's sink commit
        for entry in (checkpoint / kind).iterdir():
            batch = entry.name.removeprefix(".").removesuffix(".crc")  # the file and its checksum file
            if batch.isdigit() and (kind == "commits" or int(batch) > 0):
                entry.unlink()
    for entry in (output / "_spark_metadata").iterdir():  # nor did the sink commit it: Spark runs it again
        if entry.name.removeprefix(".").removesuffix(".crc").isdigit():
            entry.unlink()
    publish(client, stream, 20, first=0, partitions=1)  # "latest" is now past the first batch's end
    again = start()
    try:
        wait_for_rows(again, 10)
    finally:
        again.stop()
    assert again.exception() is None, again.exception()
    read = [offset for _, offset in offsets_in(spark, output)]
    assert len(read) == len(set(read)), "no offset twice"
    assert read == list(range(read[0], read[-1] + 1)), "no gap after the first offset read"


@pytest.mark.parametrize(
    "case",
    [({"startingOffsets": '{"0": 5}'}, "[1, 2]"), ({"startingOffsets": '{"0": 5}', "partitions": "1"}, "[1]")],
    ids=["some-partitions-named", "the-read-partition-not-named"],
)
def test_a_start_that_names_some_partitions_only_is_refused(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path,
    case: tuple[dict[str, str], str],
) -> None:  # fmt: skip
    """startingOffsets {"0": 5} on three partitions read partitions 1 and 2 from offset 0, and with
    partitions=1 dropped the one it named: the query now fails at its start naming the partitions without
    a start, as the batch reader does."""
    options, missing = case
    stream = new_stream(client)
    publish(client, stream, 30)
    frame = spark.readStream.format("liftbridge").option("brokers", ",".join(liftbridge_server.brokers))
    query = (
        frame.option("stream", stream)
        .options(**options)
        .load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match=rf"gives no start for partitions {re.escape(missing)}"):
        query.awaitTermination(120)


def test_use_offsets_refuses_a_row_without_an_offset(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """With useOffsets a null offset meant "the next one": a retried task stored the row again, so that row
    was at least once while the docs promise exactly once. Such a row is refused, and nothing is stored."""
    stream = new_stream(client, partitions=1, optimistic_concurrency_control=True)
    schema = StructType([*SINK_SCHEMA.fields, StructField("offset", LongType())])
    rows = [("k0", b"v0", None, 0, 0), ("k1", b"v1", None, 0, None)]
    with pytest.raises(Exception, match=r"row #1 has no offset"):
        spark.createDataFrame(rows, schema).coalesce(1).write.format("liftbridge").option(
            "brokers", ",".join(liftbridge_server.brokers)
        ).option("stream", stream).option("useOffsets", "true").mode("append").save()
    assert client.fetch_partition_metadata(stream, 0).high_watermark == -1
