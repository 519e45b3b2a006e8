"""The Parquet lake keeps each offset exactly once on the local disk and on the S3 gateway (``s3a://``).

Real Spark, a real Liftbridge server, the real filesystems: ranges in any order, overlapping ranges, a retry,
two runs at once, and a spark-submit driver SIGKILLed (with its whole process group) at each step of a run,
publishing and compaction included, then a rerun. After each, a reader of ``OUTPUT/stream=<s>`` sees every
piece whole and every offset once. An object store without conditional create is refused before anything is
claimed.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from liftbridge_provider import fault_points
from liftbridge_provider.client import LiftbridgeClient, PublishMessage
from liftbridge_provider.core.lake import LakeError, check_ledger
from liftbridge_provider.core.lake_ledger import Ledger
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.spark import ingest, parquet_ingest, reader
from liftbridge_provider.spark.lake_store import HadoopStore, NoAtomicCreateError
from liftbridge_provider.spark.parquet_ingest import Job, staging_target
from liftbridge_provider.spark.piece_writer import STATS_SCHEMA, StagingTarget, stage_pieces
from tests.spark.lake_places import LakePlace, lake_place

__all__ = ["lake_place"]  # the fixture: each test runs on the local disk and on the S3 gateway

ROOT = Path(__file__).resolve().parents[2]
INGEST = ROOT / "spark_jobs" / "ingest.py"
SPARK_SUBMIT = str(Path(sys.executable).with_name("spark-submit"))
PARTITIONS = 2


@pytest.fixture(scope="module")
def stream(liftbridge_server: DevServer) -> str:
    """Two partitions, offsets 0-299 each."""
    name = f"once-{uuid.uuid4().hex[:8]}"
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        client.create_stream(name, name, partitions=PARTITIONS)
        batch = [PublishMessage(f"{p}-{n}".encode(), partition=p) for n in range(300) for p in range(PARTITIONS)]
        client.publish_batch(name, batch, ack_policy="all")
    return name


def ranges(stream: str, start: int, end: int) -> RangesDocument:
    return RangesDocument(stream, tuple(OffsetRange(p, start, end) for p in range(PARTITIONS)))


def run_here(spark: SparkSession, brokers: list[str], document: RangesDocument, output: str, **kw: Any) -> Any:
    argv = ["--brokers", ",".join(brokers), "--ranges", document.dumps(), "--output", output]
    outcome = ingest.run(spark, ingest.parse_args(argv), **kw)
    assert outcome.problems == []
    return outcome


def seen(spark: SparkSession, output: str, stream: str) -> list[tuple[int, int]]:
    """Every (partition, offset) a reader sees, after checking that each piece it sees is whole."""
    rows = spark.read.parquet(f"{output}/stream={stream}").select("partition", "range", "offset").collect()
    pieces: dict[tuple[int, str], list[int]] = {}
    for row in rows:
        pieces.setdefault((row["partition"], str(row["range"])), []).append(row["offset"])
    for (partition, folder), offsets in pieces.items():
        start, end = map(int, folder.split("-"))
        assert sorted(offsets) == list(range(start, end)), f"partition {partition} range={folder} is not whole"
    return sorted((row["partition"], row["offset"]) for row in rows)


def exactly(start: int, end: int) -> list[tuple[int, int]]:
    return sorted((p, o) for p in range(PARTITIONS) for o in range(start, end))


def assert_once(found: list[tuple[int, int]], start: int, end: int) -> None:
    twice = {k: n for k, n in Counter(found).items() if n > 1}
    assert twice == {}, f"offsets written twice: {sorted(twice)[:10]}"
    assert found == exactly(start, end)


def test_ranges_in_any_order_overlapping_and_retried_land_each_offset_once(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, lake_place: LakePlace
) -> None:
    output = lake_place.new_lake()
    for start, end in ((100, 200), (0, 100), (50, 250), (50, 250), (0, 300)):
        run_here(spark, liftbridge_server.brokers, ranges(stream, start, end), output)
    assert_once(seen(spark, output, stream), 0, 300)
    store = HadoopStore(spark, output)
    for partition in range(PARTITIONS):
        ledger = Ledger(store, f"{store.root}/stream={stream}", partition, "reader")
        claims = ledger.claims()
        check_ledger(claims)
        assert sum(c.end - c.start for c in claims) == 300
        names = store.list_names(ledger.folder)
        assert [n for n in names if n.startswith("claim-")] == [], "every run compacted its ledger"


def test_two_runs_at_once_land_each_offset_once(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, lake_place: LakePlace
) -> None:
    """Two overlapping runs read the empty ledger at once and race for the same claims (on S3: conditional
    PUTs); each offset still lands once."""
    output = lake_place.new_lake()
    barriers = {p: threading.Barrier(2, timeout=120) for p in range(PARTITIONS)}

    class RacingStore(HadoopStore):
        """Holds each run's create of a partition's claim 0 until the other run's reaches it: both read the
        empty ledger, both try to create it."""

        def create_exclusive(self, path: str, data: bytes) -> bool:
            for partition, barrier in barriers.items():
                if path.endswith(f"/_ledger/partition={partition}/claim-0000000000.json"):
                    barrier.wait()
            return super().create_exclusive(path, data)

    store = RacingStore(spark, output)
    with ThreadPoolExecutor(2, thread_name_prefix="run") as pool:
        documents = [ranges(stream, 0, 200), ranges(stream, 100, 300)]
        list(pool.map(lambda d: run_here(spark, liftbridge_server.brokers, d, output, store=store), documents))
    assert_once(seen(spark, output, stream), 0, 300)


@pytest.mark.parametrize("lake_place", ["s3"], indirect=True)  # the local disk's create is atomic (link(2))
def test_an_object_store_without_conditional_create_is_refused_before_anything_is_claimed(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, lake_place: LakePlace
) -> None:
    bucket = lake_place.root.removeprefix("s3a://")
    spark._jsc.hadoopConfiguration().set(f"fs.s3a.bucket.{bucket}.create.conditional.enabled", "false")
    try:
        output = lake_place.new_lake()
        with pytest.raises(NoAtomicCreateError, match=r"fs\.s3a\.create\.conditional\.enabled=true"):
            run_here(spark, liftbridge_server.brokers, ranges(stream, 0, 10), output)
        assert HadoopStore(spark, output).list_files(output) == [], "nothing was claimed or written"
    finally:
        spark._jsc.hadoopConfiguration().unset(f"fs.s3a.bucket.{bucket}.create.conditional.enabled")


STEPS = [
    "ingest.claimed",  # every range claimed, nothing read
    "ledger.claimed",  # the first claim file created
    "ingest.staged",  # every piece staged, none committed
    "ledger.committed",  # a partition's commit files created, not yet checked against checkpoints
    "ingest.decided",  # committed, not yet published
    "ingest.published",  # mid-publish: the first piece's object in place, the others not
    "ledger.compacting",  # compaction: every folded piece published, no node or checkpoint yet
    "ledger.checkpointed",  # compaction: the checkpoint created, the folded claim files not yet deleted
]


def submit(brokers: list[str], document: RangesDocument, output: str, env: dict[str, str], s3: list[str]) -> int:
    command = [
        SPARK_SUBMIT, "--master", "local[2]", "--conf", f"spark.pyspark.python={sys.executable}",
        "--conf", "spark.ui.enabled=false", *s3, str(INGEST), "--brokers", ",".join(brokers),
        "--ranges", document.dumps(), "--output", output, "--min-partitions", "4",
    ]  # fmt: skip
    full_env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, **env}
    process = subprocess.Popen(
        command, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output_text, _ = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail("spark-submit did not end")
    assert process.returncode in (0, -signal.SIGKILL, 128 + signal.SIGKILL), output_text[-3000:]
    return process.returncode


@pytest.mark.parametrize("step", STEPS)
def test_a_driver_killed_at_any_step_is_finished_by_the_next_run(
    spark: SparkSession,
    liftbridge_server: DevServer,
    stream: str,
    lake_place: LakePlace,
    step: str,
) -> None:
    """spark-submit's driver and JVM are SIGKILLed together at ``step`` of a run of two pieces per partition;
    readers then see only whole pieces, and the next run (an Airflow retry, here with a bigger range) leaves
    each offset exactly once."""
    output = lake_place.new_lake()
    s3 = list(lake_place.submit_options)
    status = submit(
        liftbridge_server.brokers, ranges(stream, 0, 100), output, {fault_points.ENV: f"{step}=kill-group"}, s3
    )
    assert status != 0, f"the driver was not killed at {step}"
    published = [f for f, _ in HadoopStore(spark, output).list_files(f"{output}/stream={stream}")]
    if any(f.startswith("partition=") and f.endswith(".parquet") for f in published):
        seen(spark, output, stream)  # whatever a reader sees now is whole
    run_here(spark, liftbridge_server.brokers, ranges(stream, 0, 150), output)
    assert_once(seen(spark, output, stream), 0, 150)


def test_the_tasks_stage_the_pieces_themselves_where_pyarrow_reaches_the_lake(
    spark: SparkSession, lake_place: LakePlace
) -> None:
    """Issue 48's staging path (spark/piece_writer.py) must not fall back to Spark's writer unseen: on the local
    disk and on S3 with keys the tasks write the pieces themselves, keeping the session's codec; a codec pyarrow
    does not write alike keeps Spark's writer."""
    output = lake_place.new_lake()
    store = HadoopStore(spark, output)
    job = Job(store, "s", f"{store.root}/stream=s", "run1", {}, compacted=False, head_loss_ok=False)
    target = staging_target(spark, job)
    assert target is not None, f"{output}: Spark's writer would stage the pieces"
    assert (target.s3 is not None) == (lake_place.name == "s3")
    assert target.relative == "_staging/run1"
    assert target.compression == "snappy"
    codec = "spark.sql.parquet.compression.codec"
    before = str(spark.conf.get(codec))
    try:
        spark.conf.set(codec, "lz4")
        assert staging_target(spark, job) is None
        spark.conf.set(codec, "zstd")
        assert staging_target(spark, job) == dataclasses.replace(target, compression="zstd")
    finally:
        spark.conf.set(codec, before)
    if lake_place.name == "s3":
        conf = spark._jsc.hadoopConfiguration()
        bucket = output.removeprefix("s3a://").split("/")[0]
        key = f"fs.s3a.bucket.{bucket}.encryption.algorithm"
        conf.set(key, "SSE-KMS")
        try:
            assert staging_target(spark, job) is None, "S3A encrypts what it writes there: only S3A writes"
        finally:
            conf.unset(key)


def test_a_piece_the_tasks_write_reads_as_one_spark_writes(spark: SparkSession, tmp_path: Path) -> None:
    """A lake whose earlier pieces Spark's writer staged (before issue 48's change, or on HDFS) must stay one
    table to every reader: the same rows through Spark, and the same Parquet types through pyarrow (timestamps
    as Spark's outputTimestampType says, INT96 by default; no Arrow schema of pyarrow's own)."""
    moment = datetime.datetime(2026, 12, 7, 10, 30, 15, 123456, tzinfo=datetime.UTC)
    rows = [
        (b"k", b"v0", "s", 0, 7, moment, "subj", {"h": b"x"}),
        (None, b"v1", "s", 0, 8, None, None, None),
    ]
    frame = spark.createDataFrame(rows, reader.SCHEMA).withColumn("claim", F.lit(3).cast("long"))
    setting = "spark.sql.parquet.outputTimestampType"
    before = str(spark.conf.get(setting))
    try:
        for timestamps in ("INT96", "TIMESTAMP_MICROS"):
            spark.conf.set(setting, timestamps)
            spark_folder, ours = tmp_path / f"spark-{timestamps}", tmp_path / f"ours-{timestamps}"
            frame.drop("claim").coalesce(1).write.parquet(str(spark_folder))
            target = StagingTarget(str(ours), "_staging/r", "claim", timestamps=timestamps)
            (returned,) = frame.coalesce(1).mapInArrow(stage_pieces(target), STATS_SCHEMA).collect()
            (spark_file,) = spark_folder.glob("part-*.parquet")
            our_file = ours / returned["path"].removeprefix("_staging/r/")
            assert pq.read_schema(our_file).remove_metadata() == pq.read_schema(spark_file).remove_metadata()
            assert (
                pq.ParquetFile(our_file).schema_arrow.field("timestamp").type
                == pq.ParquetFile(spark_file).schema_arrow.field("timestamp").type
            )
            ours_read = spark.read.parquet(str(our_file)).orderBy("offset").collect()
            assert ours_read == spark.read.parquet(str(spark_file)).orderBy("offset").collect()
            assert ours_read[0]["timestamp"].astimezone(datetime.UTC) == moment
            assert (returned["rows"], returned["min_offset"], returned["max_offset"]) == (2, 7, 8)
    finally:
        spark.conf.set(setting, before)


def test_objects_the_driver_cannot_see_are_never_committed(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path
) -> None:
    """Found in review: the driver commits what the tasks say they wrote. On a cluster whose executors write a
    file: lake to disks of their own, the driver would commit objects it can never publish, and every later
    run would fail on them. The run must stop before its commits, naming the cause, and a run that sees them
    lands every offset once."""

    class ElsewhereStore(HadoopStore):
        """The driver's view of a disk the executors do not share: the staged objects are not there."""

        def list_files(self, folder: str) -> list[tuple[str, int]]:
            return [] if "/_staging/" in folder else super().list_files(folder)

    output = str(tmp_path / "lake")
    argv = ["--brokers", ",".join(liftbridge_server.brokers), "--ranges", ranges(stream, 0, 100).dumps()]
    with pytest.raises(LakeError, match="storage the driver and every executor share"):
        ingest.run(spark, ingest.parse_args([*argv, "--output", output]), store=ElsewhereStore(spark, output))
    store = HadoopStore(spark, output)
    for partition in range(PARTITIONS):
        claims = Ledger(store, f"{store.root}/stream={stream}", partition, "reader").claims()
        assert claims, "the run claimed its pieces"
        assert not any(c.committed for c in claims), "and committed none"
    run_here(spark, liftbridge_server.brokers, ranges(stream, 0, 100), output)
    assert_once(seen(spark, output, stream), 0, 100)


@pytest.mark.parametrize("lake_place", ["s3"], indirect=True)
def test_a_store_that_refuses_pyarrow_is_staged_through_s3a(
    spark: SparkSession,
    liftbridge_server: DevServer,
    stream: str,
    lake_place: LakePlace,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where S3A can write and pyarrow cannot (a region or a credential only S3A's providers resolve; here a
    wrong secret key for pyarrow alone), the run stages through Spark's S3A writer instead of failing, and
    lands every offset once."""
    real = parquet_ingest.staging_target

    def refused(spark: SparkSession, job: Job) -> StagingTarget | None:
        target = real(spark, job)
        assert target is not None
        assert target.s3 is not None
        return dataclasses.replace(target, s3=dataclasses.replace(target.s3, secret_key="not-the-key"))

    monkeypatch.setattr(parquet_ingest, "staging_target", refused)
    output = lake_place.new_lake()
    run_here(spark, liftbridge_server.brokers, ranges(stream, 0, 100), output)
    assert_once(seen(spark, output, stream), 0, 100)
