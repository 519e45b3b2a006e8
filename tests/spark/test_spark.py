"""The `liftbridge` Spark source and the ingest job, with real Spark and a real Liftbridge server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pyspark
import pytest
from pyspark.sql import DataFrame, SparkSession

from liftbridge_provider.client import (
    BeyondHighWatermarkError,
    InvalidArgumentError,
    LiftbridgeClient,
    PartitionPausedError,
    PublishMessage,
    partition_by_key,
)
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.core.spark_planning import Slice
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.devserver.config import free_port
from liftbridge_provider.spark import ingest
from liftbridge_provider.spark.options import ReadOptions, parse_options
from liftbridge_provider.spark.reader import arrow_schema, check_range, read_slice

ROOT = Path(__file__).resolve().parents[2]
INGEST = ROOT / "spark_jobs" / "ingest.py"
SPARK_SUBMIT = str(Path(sys.executable).with_name("spark-submit"))
SPARK_CLASS = str(Path(sys.executable).with_name("spark-class"))
SPARK_ENV = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}


@pytest.fixture(scope="module")
def three(client: LiftbridgeClient) -> str:
    """A stream with 3 partitions and 3,000 keyed messages with headers."""
    name = f"spark-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name, partitions=3)
    batch = [
        PublishMessage(f"value-{i}".encode(), key=f"key-{i}".encode(), headers={"n": str(i).encode()})
        for i in range(3000)
    ]
    client.publish_batch(name, batch, partitioner=partition_by_key, ack_policy="all")
    return name


def high_watermarks(client: LiftbridgeClient, stream: str) -> dict[int, int]:
    count = len(client.stream_info(stream).partitions)
    return {p: client.fetch_partition_metadata(stream, p).high_watermark for p in range(count)}


def read(spark: SparkSession, brokers: list[str], **options: str) -> DataFrame:
    return spark.read.format("liftbridge").option("brokers", ",".join(brokers)).options(**options).load()


def rows_of(frame: DataFrame) -> list[tuple[Any, ...]]:
    return sorted(
        (r.partition, r.offset, r.key, r.value, r.stream, r.subject, tuple(sorted(r.headers.items())), r.timestamp)
        for r in frame.collect()
    )


def expected_rows(client: LiftbridgeClient, document: RangesDocument) -> list[tuple[Any, ...]]:
    from datetime import UTC, datetime  # noqa: PLC0415

    rows = []
    for r in document.ranges:
        for m in client.read_range(document.stream, r.partition, r.start, r.end):
            stamp = datetime.fromtimestamp((m.timestamp // 1000) / 1e6, tz=UTC).replace(tzinfo=None)
            headers = tuple(sorted(m.raw.headers.items()))
            rows.append((r.partition, m.offset, m.key, m.value, m.stream, m.subject, headers, stamp))
    return sorted(rows)


def test_pyspark_python_matches_the_jvm(spark: SparkSession) -> None:
    assert pyspark.__version__ == spark.version


def test_exact_ranges_over_three_partitions(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, three: str
) -> None:
    hw = high_watermarks(client, three)
    document = RangesDocument(
        three, (OffsetRange(0, 10, hw[0] - 4), OffsetRange(1, 0, hw[1] + 1), OffsetRange(2, 5, 6))
    )
    frame = read(spark, liftbridge_server.brokers, ranges=document.dumps())
    assert frame.schema.simpleString() == (
        "struct<key:binary,value:binary,stream:string,partition:int,offset:bigint,timestamp:timestamp,"
        "subject:string,headers:map<string,binary>>"
    )
    rows = rows_of(frame)
    assert len(rows) == document.total
    assert rows == expected_rows(client, document)
    for partition, offset, key, value, _stream, _subject, headers, _stamp in rows:
        n = int(value.decode().split("-")[1])
        assert key == f"key-{n}".encode()
        assert dict(headers)["n"] == str(n).encode()
        assert partition_by_key(three, key, b"", 3) == partition
        assert document.range_for(partition).start <= offset < document.range_for(partition).end


def test_splitting_returns_the_same_rows(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, three: str
) -> None:
    options = {"stream": three, "startingOffsets": "earliest", "endingOffsets": "latest"}
    whole = rows_of(read(spark, liftbridge_server.brokers, **options))
    assert len(whole) == 3000
    split = read(spark, liftbridge_server.brokers, maxRecordsPerPartition="150", **options)
    assert split.rdd.getNumPartitions() >= 3000 // 150
    assert rows_of(split) == whole
    many = read(spark, liftbridge_server.brokers, minPartitions="11", **options)
    assert many.rdd.getNumPartitions() >= 11
    assert rows_of(many) == whole
    subset = read(spark, liftbridge_server.brokers, partitions="1", **options)
    assert {r[0] for r in rows_of(subset)} == {1}


def test_timestamp_options_read_the_messages_received_in_between(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """Time-bounded reads: startingTimestamp/endingTimestamp (and the per-partition JSON forms) as in Spark's Kafka
    source, in milliseconds: exactly the messages the server received in [start, end)."""
    name = f"spark-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name, partitions=2)
    for window in range(3):
        client.publish_batch(name, [f"w{window}-{i}".encode() for i in range(6)], partitioner="round_robin")
        time.sleep(1.0)
    messages = [m for p in (0, 1) for m in client.read_range(name, p, 0, 3 * 3)]
    first_of = {w: min(m.timestamp for m in messages if m.value.startswith(b"w%d" % w)) for w in range(3)}
    start_ms, end_ms = first_of[1] // 1_000_000, first_of[2] // 1_000_000  # window 1's messages, at ms precision
    frame = read(
        spark, liftbridge_server.brokers, stream=name, startingTimestamp=str(start_ms), endingTimestamp=str(end_ms)
    )
    assert sorted(r.value for r in frame.collect()) == sorted(f"w1-{i}".encode() for i in range(6))
    by_partition = read(
        spark,
        liftbridge_server.brokers,
        stream=name,
        startingOffsetsByTimestamp=json.dumps({"0": start_ms, "1": start_ms}),
        endingOffsets="latest",
    )
    assert sorted(r.value for r in by_partition.collect()) == sorted(
        f"w{w}-{i}".encode() for w in (1, 2) for i in range(6)
    )


def test_empty_ranges_and_retention(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, three: str
) -> None:
    empty = RangesDocument(three, (OffsetRange(0, 7, 7), OffsetRange(1, 0, 0)))
    assert read(spark, liftbridge_server.brokers, ranges=empty.dumps()).count() == 0

    pruned = f"spark-ret-{uuid.uuid4().hex[:6]}"
    client.create_stream(pruned, pruned, retention_max_messages=5, segment_max_bytes=256, cleaner_interval=0.2)
    client.publish_batch(pruned, [f"m{i}".encode() * 20 for i in range(40)], ack_policy="all")
    time.sleep(2)
    earliest = client.earliest_offset(pruned)
    assert earliest is not None
    assert earliest > 0
    lost = RangesDocument(pruned, (OffsetRange(0, 0, 40),))
    with pytest.raises(Exception, match=r"offsets 0-\d+ were removed by retention \(failOnDataLoss=true"):
        read(spark, liftbridge_server.brokers, ranges=lost.dumps()).count()
    skipped = read(spark, liftbridge_server.brokers, ranges=lost.dumps(), failOnDataLoss="false")
    assert sorted(r.offset for r in skipped.collect()) == list(range(earliest, 40))
    # checkRanges=false (the ingest's read: it checked the ranges itself): the task sees the lost head instead
    with pytest.raises(Exception, match=r"offsets 0-\d+ were removed by retention while they were read \(failOnD"):
        read(spark, liftbridge_server.brokers, ranges=lost.dumps(), checkRanges="false").count()
    unchecked = read(spark, liftbridge_server.brokers, ranges=lost.dumps(), checkRanges="false", failOnDataLoss="false")
    assert sorted(r.offset for r in unchecked.collect()) == list(range(earliest, 40))


def test_a_slice_that_ends_past_the_high_watermark_fails_typed_after_its_silence_not_at_read_timeout(
    liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """A task does not ask the high watermark before it reads (the planner, or the ingest before it claims,
    checked the end). A slice whose end is not committed all the same (a piece another run claimed, a high
    watermark that moved back) must not wait out readTimeout (60 s here): once silent, the task checks the
    end as the planner does and fails with the typed error naming the high watermark."""
    name = f"spark-short-{uuid.uuid4().hex[:6]}"
    client.create_stream(name, name)
    client.publish_batch(name, [b"m"] * 5, partitioner=None, ack_policy="all")
    options = read_options(liftbridge_server.brokers, readTimeout="60", requestTimeout="2")
    started = time.monotonic()
    with pytest.raises(BeyondHighWatermarkError, match=r"range \[0, 10\) goes beyond the committed high watermark 4"):
        list(read_slice(options, name, Slice(0, 0, 10), arrow_schema()))  # 0-4 wait in the batch being filled
    assert time.monotonic() - started < 20, "the task waited as long as a timeout"


def test_a_slice_whose_head_retention_removed_after_planning_is_reported_by_its_task(
    liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """The planner checks a range's head, and the ingest's read (checkRanges=false) is not planned with that
    check at all: a head retention removed before the task reads is the task's to see. It fails naming the
    removed offsets (failOnDataLoss=true), or reads exactly the offsets retention kept (false)."""
    name = f"spark-head-{uuid.uuid4().hex[:6]}"
    client.create_stream(name, name, retention_max_messages=5, segment_max_bytes=256, cleaner_interval=0.2)
    client.publish_batch(name, [f"m{i}".encode() * 20 for i in range(40)], ack_policy="all")
    deadline = time.monotonic() + 30
    while not (client.earliest_offset(name, 0) or 0) > 0:
        assert time.monotonic() < deadline, "retention did not remove the head within 30 s"
        time.sleep(0.2)
    earliest = client.earliest_offset(name, 0)
    assert earliest is not None
    work = Slice(0, 0, 40)
    with pytest.raises(InvalidArgumentError, match=rf"partition 0: offsets 0-{earliest - 1} were removed by retention"):
        list(read_slice(read_options(liftbridge_server.brokers), name, work, arrow_schema()))
    kept = read_slice(read_options(liftbridge_server.brokers, failOnDataLoss="false"), name, work, arrow_schema())
    assert [o for b in kept for o in b.column("offset").to_pylist()] == list(range(earliest, 40))


def test_range_beyond_what_the_leader_holds_is_refused_at_once(
    liftbridge_server: DevServer, client: LiftbridgeClient, three: str
) -> None:
    """The driver's check of a range that ends past both the committed high watermark and the newest offset
    the leader holds: nothing will fill it, so the read is refused at once with the typed error naming the
    partition, the range and the high watermark, not after asking again for requestTimeout (10 s)."""
    info = client.fetch_partition_metadata(three, 0)
    assert info.newest_offset == info.high_watermark
    end = info.high_watermark + 5
    document = RangesDocument(three, (OffsetRange(0, 0, end),))
    options = parse_options({"brokers": ",".join(liftbridge_server.brokers), "ranges": document.dumps()})
    assert options.config.request_timeout == 10
    with LiftbridgeClient(options.config) as planner:
        started = time.monotonic()
        with pytest.raises(
            BeyondHighWatermarkError,
            match=rf"partition 0: range \[0, {end}\) goes beyond the committed high watermark {info.high_watermark}",
        ):
            check_range(planner, three, OffsetRange(0, 0, end), options)
    elapsed = time.monotonic() - started
    assert elapsed < 2.0, f"the range check took {elapsed:.1f}s to refuse a range nothing will fill"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ranges": "{not json"}, "ranges document is not valid JSON"),
        ({"ranges": '{"stream": "S", "ranges": [{"partition": 9, "start": 0, "end": 1}]}'}, "no partition 9"),
        ({"ranges": '{"stream": "S", "ranges": [{"partition": 0, "start": 5, "end": 1}]}'}, "end 1 is before start 5"),
        ({"ranges": "{}", "startingOffsets": "earliest", "endingOffsets": "latest"}, "either ranges or"),
        ({"stream": "S", "startingOffsets": "earliest", "endingOffsets": "latest", "colour": "red"}, "['colour']"),
        ({"stream": "S", "startingOffsets": '{"0": 9}', "endingOffsets": '{"0": 2}'}, "end 2 is before start 9"),
        (
            {
                "stream": "S",
                "partitions": "0",
                "startingOffsets": "earliest",
                "endingOffsets": '{"0": 99999}',
                "requestTimeout": "1",
            },
            "beyond the committed",
        ),
        (
            {"stream": "S", "startingOffsets": "earliest", "endingOffsets": '{"0": 9}'},
            "must both give partitions [1, 2]",
        ),
        (
            {"stream": "S", "startingOffsets": "earliest"},
            "give ranges, or a start (startingOffsets, startingTimestamp or startingOffsetsByTimestamp) and an end",
        ),
        ({"ranges": "{}", "minPartitions": "0"}, "option minPartitions must be a finite number > 0"),
        # a partition the stream does not have was dropped in silence; one named twice kept the last offset
        # given, and the offsets before it were never read
        (
            {"stream": "S", "startingOffsets": '{"0": 0, "5": 0}', "endingOffsets": '{"0": 1, "5": 1}'},
            "no partition 5",
        ),
        (
            {"stream": "S", "startingOffsets": '{"0": 1, "00": 2}', "endingOffsets": '{"0": 9}'},
            "names partition 0 twice",
        ),
        ({"stream": "S", "startingOffsets": "earliestt", "endingOffsets": "latest"}, "must be earliest, latest or"),
        (
            {"stream": "S", "startingOffsetsByTimestamp": '{"5": 1}', "endingOffsetsByTimestamp": '{"5": 2}'},
            "no partition 5",
        ),
    ],
)
def test_bad_input_is_refused_before_any_task(
    spark: SparkSession, liftbridge_server: DevServer, three: str, options: dict[str, str], message: str
) -> None:
    options = {
        k: v.replace('"S"', json.dumps(three)).replace("S", three) if k != "colour" else v for k, v in options.items()
    }
    tasks_before = spark.sparkContext.statusTracker().getJobIdsForGroup()
    with pytest.raises(Exception, match=re.escape(message)):  # Spark wraps the source's InvalidArgumentError
        read(spark, liftbridge_server.brokers, **options).count()
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == tasks_before, "no Spark job ran"


def run_ingest(
    brokers: list[str] | None,
    ranges: RangesDocument,
    output: Path | str,
    *extra: str,
    master: str = "local[2]",
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    command = [
        SPARK_SUBMIT,
        "--master",
        master,
        "--conf",
        f"spark.pyspark.python={sys.executable}",
        "--conf",
        "spark.ui.enabled=false",
        str(INGEST),
        *(["--brokers", ",".join(brokers)] if brokers is not None else []),
        "--ranges",
        ranges.dumps(),
        "--output",
        str(output),
        *extra,
    ]
    return subprocess.run(
        command, env={**SPARK_ENV, **(env or {})}, cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )


def ingest_here(
    spark: SparkSession, brokers: list[str] | None, ranges: RangesDocument, output: Path | str, *extra: str
) -> int:
    """The ingest job on the test's Spark session, as spark-submit runs it after its input checks (executors
    checked, outcome logged to the ``liftbridge.ingest`` logger); returns the job's exit status. The tests
    below that need the job's own process (its exit, its driver, another Python) run :func:`run_ingest`."""
    argv = [*(["--brokers", ",".join(brokers)] if brokers is not None else []), "--ranges", ranges.dumps()]
    return ingest.run_reported(spark, ingest.parse_args([*argv, "--output", str(output), *extra]))


def parquet_rows(spark: SparkSession, folder: Path) -> list[tuple[Any, ...]]:
    return sorted(
        tuple(r) for r in spark.read.parquet(str(folder)).select("partition", "offset", "key", "value").collect()
    )


def test_ingest_job_writes_each_range_once_and_reruns_identically(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, three: str, tmp_path: Path
) -> None:
    """One folder per range and one manifest; a rerun of the same ranges replaces them, adding no row and no
    manifest; the job never moves the cursor."""
    hw = high_watermarks(client, three)
    document = RangesDocument(three, tuple(OffsetRange(p, 0, hw[p] + 1) for p in range(3)), cursor_id="ingest")
    output = tmp_path / "lake"
    assert ingest_here(spark, liftbridge_server.brokers, document, output) == 0
    folders = sorted(p.relative_to(output) for p in output.glob("stream=*/partition=*/range=*"))
    assert [str(f) for f in folders] == [f"stream={three}/partition={p}/range=0-{hw[p] + 1}" for p in range(3)]
    before = parquet_rows(spark, output / f"stream={three}")
    assert len(before) == 3000
    manifests = list((output / f"stream={three}" / "_manifests").glob("*.json"))
    assert len(manifests) == 1
    manifest = json.loads(manifests[0].read_text())
    assert manifest["total_rows"] == 3000
    assert [w["rows"] for w in manifest["written"]] == [hw[p] + 1 for p in range(3)]

    assert ingest_here(spark, liftbridge_server.brokers, document, output) == 0
    assert parquet_rows(spark, output / f"stream={three}") == before, "a rerun replaces, never duplicates"
    assert len(list((output / f"stream={three}" / "_manifests").glob("*.json"))) == 1
    assert all(client.fetch_cursor("ingest", three, p) == -1 for p in range(3)), "the job never moves the cursor"


def test_ingest_job_exits_nonzero_on_shortfall(
    spark: SparkSession,
    liftbridge_server: DevServer,
    client: LiftbridgeClient,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A compacted stream read without --compacted holds fewer rows than offsets: the job fails and says so;
    with --compacted the same range is whole."""
    compacted = f"spark-cmp-{uuid.uuid4().hex[:6]}"
    client.create_stream(compacted, compacted, compact_enabled=True, segment_max_bytes=256, cleaner_interval=0.2)
    client.publish_batch(
        compacted, [PublishMessage(b"v" * 30, key=f"k{i % 2}".encode()) for i in range(40)], ack_policy="all"
    )
    time.sleep(2)
    document = RangesDocument(compacted, (OffsetRange(0, 0, 40),))
    assert ingest_here(spark, liftbridge_server.brokers, document, tmp_path / "strict") != 0
    printed = caplog.text
    # the job's row check, or the read's own (at load(), or in the task: "... while they were read (...")
    said_lost = re.search(r"were removed by retention[^(]*\(failOnDataLoss=true", printed)
    assert "rows for 40 offsets [0, 40)" in printed or said_lost, printed[-2000:]
    caplog.clear()
    lenient = ingest_here(spark, liftbridge_server.brokers, document, tmp_path / "lenient", "--compacted")
    assert lenient == 0, caplog.text


@contextlib.contextmanager
def standalone_cluster(folder: Path, worker_env: dict[str, str]) -> Iterator[str]:
    """A Spark standalone master and one worker (2 cores) on 127.0.0.1; yields the master URL."""
    port, master_ui, worker_ui = free_port(), free_port(), free_port()
    logs = folder / "logs"
    logs.mkdir(parents=True)
    master = subprocess.Popen(
        [SPARK_CLASS, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
         "--webui-port", str(master_ui)],
        env=SPARK_ENV,
        stdout=(logs / "master.log").open("w"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    worker = subprocess.Popen(
        [SPARK_CLASS, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}", "--host", "127.0.0.1",
         "--webui-port", str(worker_ui), "--cores", "2", "--memory", "1g", "--work-dir", str(folder / "work")],
        env=worker_env,
        stdout=(logs / "worker.log").open("w"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while "Successfully registered with master" not in (logs / "worker.log").read_text():
            assert time.monotonic() < deadline, (logs / "worker.log").read_text()[-2000:]
            assert worker.poll() is None, (logs / "worker.log").read_text()[-2000:]
            assert master.poll() is None, (logs / "master.log").read_text()[-2000:]
            time.sleep(0.5)
        yield f"spark://127.0.0.1:{port}"
        assert "app-" in (logs / "master.log").read_text(), "the application ran on the standalone master"
    finally:
        for process in (worker, master):
            process.terminate()
            process.wait(timeout=30)


def test_ingest_job_on_a_standalone_master_and_worker(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, three: str, tmp_path: Path
) -> None:
    with standalone_cluster(tmp_path / "cluster", SPARK_ENV) as master:
        hw = high_watermarks(client, three)
        document = RangesDocument(three, tuple(OffsetRange(p, 0, hw[p] + 1) for p in range(3)))
        result = run_ingest(liftbridge_server.brokers, document, tmp_path / "lake", master=master)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert len(parquet_rows(spark, tmp_path / "lake" / f"stream={three}")) == 3000


def test_the_packed_environment_is_the_only_way_the_code_reaches_executors_with_another_python(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, three: str, tmp_path: Path
) -> None:
    """Shipping the packed environment to a real cluster: the worker's Python is the bare interpreter this venv was made
    from (no grpc, no pyarrow, no liftbridge_provider). Without the archive the job stops at once and says why (Spark
    alone would report 'Failed to find the data source: liftbridge'); with `make dist`'s archive shipped by --archives
    it ingests every offset. The job is submitted by the installed module's path."""
    packed = subprocess.run(
        [str(ROOT / "tools" / "pack-env.sh")], capture_output=True, text=True, timeout=900, check=False
    )
    assert packed.returncode == 0, packed.stdout + packed.stderr
    archive = ROOT / "dist" / "liftbridge-spark-env.tar.gz"
    bare = str(Path(sys.base_prefix) / "bin" / "python3")
    assert subprocess.run([bare, "-c", "import grpc"], capture_output=True, check=False).returncode != 0
    job = subprocess.run(
        [sys.executable, "-m", "liftbridge_provider.spark.ingest", "--path"], capture_output=True, text=True, check=True
    ).stdout.strip()
    worker_env = {**SPARK_ENV, "PYSPARK_PYTHON": bare}
    hw = high_watermarks(client, three)
    document = RangesDocument(three, tuple(OffsetRange(p, 0, hw[p] + 1) for p in range(3)))

    # Client mode: Spark plans a Python data source read in a Python worker on the driver, started with
    # spark.pyspark.python, so ./env must exist where spark-submit runs too (docs/spark.md).
    here = tmp_path / "submit"
    (here / "env").mkdir(parents=True)
    with tarfile.open(archive) as packed_env:
        packed_env.extractall(here / "env", filter="tar")

    def submit(*shipping: str, lake: Path) -> subprocess.CompletedProcess[str]:
        command = [SPARK_SUBMIT, "--master", master, "--conf", "spark.ui.enabled=false",
                   "--conf", f"spark.pyspark.driver.python={sys.executable}", *shipping, job,
                   "--brokers", ",".join(liftbridge_server.brokers), "--ranges", document.dumps(),
                   "--output", str(lake)]  # fmt: skip
        return subprocess.run(
            command, env=SPARK_ENV, cwd=here, capture_output=True, text=True, timeout=600, check=False
        )

    with standalone_cluster(tmp_path / "cluster", worker_env) as master:
        without = submit("--conf", f"spark.pyspark.python={bare}", lake=tmp_path / "lake-without")
        shipped = submit(
            "--archives", f"{archive}#env", "--conf", "spark.pyspark.python=./env/bin/python", lake=tmp_path / "lake"
        )
    output = without.stdout + without.stderr
    assert without.returncode != 0, output[-3000:]
    assert "the executors' Python" in output, output[-3000:]
    assert "cannot import liftbridge_provider" in output
    assert shipped.returncode == 0, (shipped.stdout + shipped.stderr)[-3000:]
    assert len(parquet_rows(spark, tmp_path / "lake" / f"stream={three}")) == 3000


@pytest.mark.cluster
def test_leader_kill_during_a_read_returns_exactly_the_range(
    spark: SparkSession, liftbridge_cluster: DevServer
) -> None:
    with LiftbridgeClient(liftbridge_cluster.brokers, request_timeout=30) as cluster_client:
        cluster_client.create_stream("spark-fo", "spark-fo", replication_factor=3, min_isr=2)
        cluster_client.publish_batch("spark-fo", [f"v{i}".encode() for i in range(60_000)], ack_policy="all")
        leader = cluster_client.fetch_partition_metadata("spark-fo", 0).leader
        assert leader is not None
        killer = threading.Timer(1.5, liftbridge_cluster.kill, args=(leader,))
        killer.start()
        frame = read(
            spark, liftbridge_cluster.brokers, ranges=RangesDocument("spark-fo", (OffsetRange(0, 0, 60_000),)).dumps(),
            maxRecordsPerPartition="500", requestTimeout="30",
        )  # fmt: skip
        offsets = sorted(r.offset for r in frame.select("offset").collect())
        killer.join()
        assert offsets == list(range(60_000))
        assert not liftbridge_cluster.node(leader).running, "the leader was killed during the read"


def is_paused(client: LiftbridgeClient, stream: str, partition: int) -> bool:
    """Asked of the partition's leader: a paused partition refuses FetchPartitionMetadata, or says so."""
    try:
        return client.fetch_partition_metadata(stream, partition).paused
    except PartitionPausedError:
        return True


def wait_until_paused(client: LiftbridgeClient, stream: str, partitions: range, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(is_paused(client, stream, p) for p in partitions):
        assert time.monotonic() < deadline, "the partitions did not pause"
        time.sleep(0.3)


@pytest.mark.parametrize("how", ["auto_pause_time", "pause_stream"])
def test_paused_partitions_are_planned_without_resuming_and_read_with_resume(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, how: str
) -> None:
    """Paused partitions, Spark side: idle partitions pause (auto_pause_time) or are paused; reading one must
    work. A partition whose range is empty is planned from metadata and stays paused; a non-empty range's
    read resumes its partition."""
    name = f"spark-pause-{uuid.uuid4().hex[:6]}"
    options = {"auto_pause_time": 1} if how == "auto_pause_time" else {}
    client.create_stream(name, name, partitions=2, **options)
    client.publish_batch(name, [f"p{i}".encode() for i in range(50)], partitioner=lambda *_: 0, ack_policy="all")
    if how == "pause_stream":
        client.pause_stream(name)
    wait_until_paused(client, name, range(2))
    frozen = RangesDocument(name, (OffsetRange(0, 0, 50), OffsetRange(1, 0, 0)))
    rows = read(spark, liftbridge_server.brokers, ranges=frozen.dumps()).select("partition", "offset").collect()
    assert sorted((r.partition, r.offset) for r in rows) == [(0, i) for i in range(50)]
    assert is_paused(client, name, 1), "an empty range never resumes its partition"
    latest = read(spark, liftbridge_server.brokers, stream=name, startingOffsets="earliest", endingOffsets="latest")
    assert latest.count() == 50
    assert is_paused(client, name, 1), "earliest/latest of an empty paused partition come from its metadata"


def test_compacted_option_reads_a_compacted_head_without_reporting_loss(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """Compacted streams, Spark side: compaction removed a range's first offsets; with compacted=true that is
    normal (failOnDataLoss stays true and does not fire); without it, it reads as retention loss."""
    name = f"spark-cmp-{uuid.uuid4().hex[:6]}"
    client.create_stream(name, name, compact_enabled=True, segment_max_bytes=256, cleaner_interval=0.2)
    keyed = [PublishMessage(b"v" * 30, key=f"k{i % 2}".encode()) for i in range(40)]
    client.publish_batch(name, keyed, ack_policy="all")
    time.sleep(2)
    survivors = [m.offset for m in client.read_range(name, 0, 0, 40)]
    assert survivors[0] > 0, "compaction removed the head"
    frozen = RangesDocument(name, (OffsetRange(0, 0, 40),)).dumps()
    compacted = read(spark, liftbridge_server.brokers, ranges=frozen, compacted="true")
    assert sorted(r.offset for r in compacted.select("offset").collect()) == survivors
    with pytest.raises(Exception, match="were removed by retention"):
        read(spark, liftbridge_server.brokers, ranges=frozen).count()


def read_options(brokers: list[str], **options: str) -> ReadOptions:
    return parse_options({"brokers": ",".join(brokers), "ranges": "{}", **options})


def test_read_timeout_bounds_silence_not_a_long_read_that_keeps_progressing(
    liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """readTimeout bounded a whole task, so a big backlog failed every retry. A slice read
    for well over readTimeout (1 s here: 10 batches, the consumer taking 0.4 s over each) that receives
    messages all along must succeed."""
    name = f"spark-slow-{uuid.uuid4().hex[:6]}"
    client.create_stream(name, name)
    client.publish_batch(name, [b"x" * 64] * 20_000, ack_policy="all")
    options = read_options(liftbridge_server.brokers, readTimeout="1", batchSize="2000")
    started, rows = time.monotonic(), 0
    for batch in read_slice(options, name, Slice(0, 0, 20_000), arrow_schema()):
        rows += batch.num_rows
        time.sleep(0.4)  # a slow writer downstream
    assert rows == 20_000
    assert time.monotonic() - started > 3, "the read lasted longer than readTimeout"


def test_large_messages_are_batched_by_bytes(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """Batches bounded by bytes, not only rows: 12 messages of 600 KiB (7 MiB in one slice) under batchBytes=1.5 MiB
    come as batches of 2 messages; the same option through Spark returns every row."""
    name = f"spark-big-{uuid.uuid4().hex[:6]}"
    client.create_stream(name, name)
    values = [bytes([i]) * (600 * 1024) for i in range(12)]
    client.publish_batch(name, values, ack_policy="all")
    options = read_options(liftbridge_server.brokers, batchBytes=str(1536 * 1024))
    batches = list(read_slice(options, name, Slice(0, 0, 12), arrow_schema()))
    assert [b.num_rows for b in batches] == [2] * 6
    headers = [sum(len(k) + len(v) for k, v in h) for b in batches for h in b.column("headers").to_pylist()]
    assert all(sum(len(v) for v in b.column("value").to_pylist()) <= 1536 * 1024 for b in batches)
    assert max(headers) < 1024, "values dominate each batch's bytes"
    frame = read(spark, liftbridge_server.brokers, ranges=RangesDocument(name, (OffsetRange(0, 0, 12),)).dumps(),
                 batchBytes=str(1536 * 1024))  # fmt: skip
    assert sorted((r.offset, r.value) for r in frame.select("offset", "value").collect()) == list(enumerate(values))


def test_manifest_lands_beside_the_data_for_a_uri_output(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, three: str, tmp_path: Path
) -> None:
    """write_manifest used pathlib, so a URI output (file://, s3a://) put the manifest
    on the driver's disk under a folder named after the URI. It must land beside the data."""
    hw = high_watermarks(client, three)
    document = RangesDocument(three, tuple(OffsetRange(p, 0, hw[p] + 1) for p in range(3)))
    workdir, output = tmp_path / "cwd", tmp_path / "lake"
    workdir.mkdir()
    # Another working folder, no PYTHONPATH: Spark finds pyspark_liftbridge of the installed project (the
    # editable install is path-based for that; an import-hook install made this fail with "Failed to find
    # the data source: liftbridge").
    result = run_ingest(liftbridge_server.brokers, document, f"file://{output}", cwd=workdir, env={"PYTHONPATH": ""})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    manifests = list((output / f"stream={three}" / "_manifests").glob("*.json"))
    assert len(manifests) == 1, "the manifest is beside the data"
    assert json.loads(manifests[0].read_text())["total_rows"] == 3000
    assert list(workdir.rglob("*.json")) == [], "nothing on the driver's working folder"
    assert len(parquet_rows(spark, output / f"stream={three}")) == 3000


def test_ingest_job_takes_the_whole_connection_from_json(
    spark: SparkSession,
    liftbridge_server: DevServer,
    client: LiftbridgeClient,
    three: str,
    tmp_path: Path,
) -> None:
    """The job got only --brokers (the DAG passed the connection's host, dropping its port
    and TLS fields). With LIFTBRIDGE_CONN_JSON (Airflow's JSON form, port in its own field, extra as a
    string) and no --brokers, it reads the stream."""
    host, port = liftbridge_server.brokers[0].rsplit(":", 1)
    conn = {"conn_type": "liftbridge", "host": host, "port": int(port), "extra": json.dumps({"request_timeout": "20"})}
    hw = high_watermarks(client, three)
    document = RangesDocument(three, (OffsetRange(1, 0, hw[1] + 1),))
    output = tmp_path / "lake"
    with mock.patch.dict(os.environ, {"LIFTBRIDGE_CONN_JSON": json.dumps(conn)}):
        assert ingest_here(spark, None, document, output) == 0
    assert len(parquet_rows(spark, output / f"stream={three}")) == hw[1] + 1


def test_a_slice_retention_removed_while_its_task_waited_ends_at_once_not_at_read_timeout(
    liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """Found by the chaos harness (seed 63): the planner saw [0, 6) retained, then retention by age removed
    all of it before the task read. The server then sends nothing, so the read waited the whole readTimeout
    (120 s by default) and failed with a timeout, with failOnDataLoss=false too. The task must ask what
    retention left once it has waited a few seconds: skip the removed offsets (failOnDataLoss=false) or
    fail naming them as removed by retention (true), well before readTimeout (60 s here)."""
    name = f"spark-aged-{uuid.uuid4().hex[:6]}"
    client.create_stream(name, name, retention_max_age=2, segment_max_age=1, cleaner_interval=1)
    client.publish_batch(name, [b"old"] * 6, partitioner=None, ack_policy="all")
    deadline = time.monotonic() + 30
    while client.earliest_offset(name, 0) != 6:
        assert time.monotonic() < deadline, "retention did not remove the messages within 30 s"
        time.sleep(0.5)
    work = Slice(0, 0, 6)
    started = time.monotonic()
    skipped = list(read_slice(read_options(liftbridge_server.brokers, readTimeout="60", failOnDataLoss="false"),
                              name, work, arrow_schema()))  # fmt: skip
    assert sum(b.num_rows for b in skipped) == 0
    assert time.monotonic() - started < 20, "skipping the removed offsets took as long as a timeout"
    started = time.monotonic()
    failing = read_options(liftbridge_server.brokers, readTimeout="60")
    with pytest.raises(InvalidArgumentError, match=r"partition 0: offsets 0-5 were removed by retention"):
        list(read_slice(failing, name, work, arrow_schema()))
    assert time.monotonic() - started < 20
