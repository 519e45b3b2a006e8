"""``ingest.py --format delta`` lands every offset exactly once in a Delta table.

Real Spark (``local[2]`` in this process, and ``spark-submit`` for a killed driver), a real Liftbridge
server, the real local filesystem, and delta-rs reading the table back. Each test tries to break the
guarantee: a rerun, overlapping ranges, a driver killed between writing the files and committing them,
two runs committing at once, and a compacted stream whose range would come up short.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from liftbridge_provider import fault_points
from liftbridge_provider.client import InvalidArgumentError, LiftbridgeClient, PublishMessage
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.delta_table import holdings
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.operators.ranges import LiftbridgeOffsetRangesOperator
from liftbridge_provider.spark import delta_ingest, ingest
from tests.chaos.batch import StateStore
from tests.spark.stream_queries import run_available_now

ROOT = Path(__file__).resolve().parents[2]
INGEST = ROOT / "spark_jobs" / "ingest.py"
SPARK_SUBMIT = str(Path(sys.executable).with_name("spark-submit"))


@pytest.fixture(scope="module")
def stream(client: LiftbridgeClient) -> str:
    """Two partitions, offsets 0-199 each; the value names its partition and offset."""
    name = f"delta-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name, partitions=2)
    publish(client, name, 0, 200)
    return name


def use_connection(monkeypatch: pytest.MonkeyPatch, server: DevServer) -> None:
    """The Airflow connection ``delta_test`` (from the environment) for operators run in this process."""
    connection = {"conn_type": "liftbridge", "host": server.brokers[0]}
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_TEST", json.dumps(connection))


def publish(client: LiftbridgeClient, stream: str, first: int, end: int) -> None:
    """Offsets first..end-1 on both partitions; the value names its partition and offset."""
    batch = [PublishMessage(f"p{p}-{n}".encode(), partition=p) for n in range(first, end) for p in range(2)]
    client.publish_batch(stream, batch, ack_policy="all")


def document(stream: str, *ranges: tuple[int, int, int]) -> RangesDocument:
    return RangesDocument(stream, tuple(OffsetRange(p, s, e) for p, s, e in ranges))


def run_here(spark: SparkSession, brokers: list[str], ranges: RangesDocument, table: Path) -> Any:
    """The job's ``run`` in this process, on the test's Spark session."""
    args = ingest.parse_args(
        ["--brokers", ",".join(brokers), "--ranges", ranges.dumps(), "--output", str(table), "--format", "delta"]
    )
    return ingest.run(spark, args)


def table_rows(table: Path) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every row a Delta reader sees, sorted."""
    data = DeltaTable(str(table)).to_pyarrow_table(columns=["partition", "offset", "value"]).to_pylist()
    return sorted((row["partition"], row["offset"], row["value"]) for row in data)


def timestamp_types(table: Path) -> set[str]:
    """The Arrow type of the timestamp column in every committed file (INT96 would read as ns)."""
    files = DeltaTable(str(table)).file_uris()
    return {str(pq.ParquetFile(f.removeprefix("file://")).schema_arrow.field("timestamp").type) for f in files}


def expected(*ranges: tuple[int, int, int]) -> list[tuple[int, int, bytes]]:
    return sorted((p, n, f"p{p}-{n}".encode()) for p, s, e in ranges for n in range(s, e))


def test_ranges_land_once_and_reruns_overlaps_and_the_next_range_add_nothing_twice(
    spark: SparkSession,
    liftbridge_server: DevServer,
    client: LiftbridgeClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three runs and a freeze: the ranges, a rerun (adds nothing), an overlap (adds only the new offsets),
    then LiftbridgeOffsetRangesOperator(start="delta") freezes the next ranges from the table's offsets."""
    name = f"delta-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name, partitions=2)
    publish(client, name, 0, 200)
    table = tmp_path / "orders"
    first = run_here(spark, liftbridge_server.brokers, document(name, (0, 0, 150), (1, 0, 200)), table)
    assert first.problems == []
    assert table_rows(table) == expected((0, 0, 150), (1, 0, 200))
    delta = DeltaTable(str(table))
    assert holdings(delta, name, range(2)) == {0: [(0, 150)], 1: [(0, 200)]}
    assert delta.metadata().partition_columns == ["partition"]
    version = delta.version()

    again = run_here(spark, liftbridge_server.brokers, document(name, (0, 0, 150), (1, 0, 200)), table)
    assert (again.problems, again.entries) == ([], []), "a rerun of committed ranges writes nothing"
    assert DeltaTable(str(table)).version() == version

    overlap = run_here(spark, liftbridge_server.brokers, document(name, (0, 100, 200), (1, 150, 200)), table)
    assert [(e["partition"], e["start"], e["end"], e["rows"]) for e in overlap.entries] == [(0, 150, 200, 50)]
    assert table_rows(table) == expected((0, 0, 200), (1, 0, 200))

    publish(client, name, 200, 260)  # the next freeze starts from what the table holds
    monkeypatch.setenv(
        "AIRFLOW_CONN_DELTA_TEST", json.dumps({"conn_type": "liftbridge", "host": liftbridge_server.brokers[0]})
    )
    freeze = LiftbridgeOffsetRangesOperator(
        task_id="freeze", stream=name, start="delta", delta_table=f"file://{table}", liftbridge_conn_id="delta_test"
    )
    following_ranges = RangesDocument.parse(freeze.execute({"run_id": "r1", "task_state_store": StateStore()}))
    assert [(r.partition, r.start, r.end) for r in following_ranges.ranges] == [(0, 200, 260), (1, 200, 260)]
    following = run_here(spark, liftbridge_server.brokers, following_ranges, table)
    assert sum(e["rows"] for e in following.entries) == 120
    assert table_rows(table) == expected((0, 0, 260), (1, 0, 260))

    history = DeltaTable(str(table)).history()  # newest first: 3 data commits after the table's creation
    commits = [h for h in history if h.get("liftbridge.stream") == name]
    assert len(commits) == 3
    assert [h["operation"] for h in history][-1] == "CREATE TABLE"
    # The files are plain Parquet, partitioned by folder: Spark reads exactly the committed ones.
    frame = spark.read.parquet(*DeltaTable(str(table)).file_uris()).select("offset", "timestamp", "headers")
    assert frame.count() == 520
    assert frame.filter("timestamp IS NULL").count() == 0, "timestamps survive the Parquet -> Delta path"


def test_a_freeze_from_a_table_that_lacks_partitions_starts_them_at_the_earliest(
    liftbridge_server: DevServer, stream: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_DELTA_TEST", json.dumps({"conn_type": "liftbridge", "host": liftbridge_server.brokers[0]})
    )
    freeze = LiftbridgeOffsetRangesOperator(
        task_id="freeze",
        stream=stream,
        start="delta",
        delta_table=str(tmp_path / "none"),
        liftbridge_conn_id="delta_test",
    )
    frozen = RangesDocument.parse(freeze.execute({"run_id": "r1", "task_state_store": StateStore()}))
    assert [(r.partition, r.start, r.end) for r in frozen.ranges] == [(0, 0, 200), (1, 0, 200)]
    with pytest.raises(ValueError, match="start='delta' and delta_table go together"):
        LiftbridgeOffsetRangesOperator(task_id="bad", stream=stream, start="delta", liftbridge_conn_id="delta_test")


def test_a_driver_killed_between_writing_and_committing_leaves_each_offset_once(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path
) -> None:
    """spark-submit's driver dies (os._exit, as a kill) after Spark wrote the files, before the Delta commit:
    the table does not show them; the retry writes the range again and commits it once."""
    table = tmp_path / "orders"
    ranges = document(stream, (0, 0, 120), (1, 0, 80))
    command = [
        SPARK_SUBMIT, "--master", "local[2]", "--conf", f"spark.pyspark.python={sys.executable}",
        "--conf", "spark.ui.enabled=false", str(INGEST), "--brokers", ",".join(liftbridge_server.brokers),
        "--ranges", ranges.dumps(), "--output", str(table), "--format", "delta",
    ]  # fmt: skip
    env = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    env[fault_points.ENV] = "ingest.table_written=exit"
    crashed = subprocess.run(
        command, check=False, env={**os.environ, **env}, capture_output=True, text=True, timeout=600
    )
    assert crashed.returncode == fault_points.EXIT_STATUS, crashed.stderr[-3000:]
    assert list(table.glob("liftbridge-*/partition=*/*.parquet")), "the killed run had written its files"
    assert DeltaTable(str(table)).file_uris() == [], "nothing was committed"

    retry = run_here(spark, liftbridge_server.brokers, ranges, table)
    assert retry.problems == []
    assert table_rows(table) == expected((0, 0, 120), (1, 0, 80))


def test_two_runs_committing_at_once_leave_each_offset_once(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of the same ranges (an Airflow retry while the first attempt still runs) both write their files,
    then commit at the same moment: Delta refuses the second commit (concurrent transaction on the same app ids),
    the loser plans again, finds the ranges held and writes nothing. Then again on an existing table.

    Guards the defect this test found in the first version of the Delta writer: it created the table together
    with the first files, and delta-rs let two crossing creates both succeed (both runs' rows in the table)."""
    table = tmp_path / "orders"
    both_written = threading.Barrier(2, timeout=120)
    for ranges in (document(stream, (0, 0, 60), (1, 0, 90)), document(stream, (0, 40, 160), (1, 90, 130))):
        outcomes: list[Any] = []
        errors: list[BaseException] = []

        def one_run(
            ranges: RangesDocument = ranges, outcomes: list[Any] = outcomes, errors: list[Any] = errors
        ) -> None:
            try:
                outcomes.append(run_here(spark, liftbridge_server.brokers, ranges, table))
            except BaseException as exc:  # shown by the assertion below
                errors.append(exc)

        runs = [threading.Thread(target=one_run) for _ in range(2)]
        with fault_points.armed("ingest.table_written", lambda _: both_written.wait()):
            for thread in runs:
                thread.start()
            for thread in runs:
                thread.join(300)
        assert errors == []
        assert len(outcomes) == 2
        assert sorted(bool(o.entries) for o in outcomes) == [False, True], "one run committed, the other found it held"
    assert table_rows(table) == expected((0, 0, 160), (1, 0, 130))
    assert timestamp_types(table) == {"timestamp[us, tz=UTC]"}, "overlapping writes keep Delta's microseconds"
    counts = Counter((p, o) for p, o, _ in table_rows(table))
    assert max(counts.values()) == 1


def test_a_range_compaction_shortened_is_not_committed_unless_compacted(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    """A compacted stream holds fewer rows than its range spans: the strict run commits nothing and reports it;
    with --compacted the survivors land and the partition's next offset is the range's end."""
    name = f"delta-cmp-{uuid.uuid4().hex[:6]}"
    client.create_stream(name, name, compact_enabled=True, segment_max_bytes=256, cleaner_interval=0.2)
    batch = [PublishMessage(b"v" * 30, key=f"k{i % 2}".encode()) for i in range(40)]
    client.publish_batch(name, batch, ack_policy="all")
    time.sleep(2)
    ranges = document(name, (0, 0, 40))
    table = tmp_path / "compacted"
    brokers = ",".join(liftbridge_server.brokers)
    strict_args = ["--brokers", brokers, "--ranges", ranges.dumps(), "--output", str(table), "--format", "delta"]
    try:  # the source may stop the read itself (failOnDataLoss), else the job's row check reports it
        reported = " ".join(ingest.run(spark, ingest.parse_args(strict_args)).problems)
    except Exception as exc:
        reported = str(exc)
    assert "rows for 40 offsets [0, 40)" in reported or "failOnDataLoss=true" in reported, reported[-2000:]
    committed = DeltaTable(str(table))
    assert committed.file_uris() == [], "a short piece is not committed"
    assert holdings(committed, name, [0]) == {0: []}
    lenient = ingest.run(
        spark, ingest.parse_args(["--brokers", brokers, "--ranges", ranges.dumps(), "--output", str(table),
                                  "--format", "delta", "--compacted"])
    )  # fmt: skip
    assert lenient.problems == []
    rows = table_rows(table)
    assert 0 < len(rows) < 40
    assert len({o for _, o, _ in rows}) == len(rows)
    assert holdings(DeltaTable(str(table)), name, [0]) == {0: [(0, 40)]}
    # A piece compaction emptied entirely: no row, no file; its offsets still count as written.
    survivors = sorted(o for _, o, _ in rows)
    assert survivors[0] > 0, "compaction removed the head"
    empty = tmp_path / "emptied"
    args = ["--brokers", brokers, "--ranges", document(name, (0, 0, survivors[0])).dumps(), "--output", str(empty)]
    outcome = ingest.run(spark, ingest.parse_args([*args, "--format", "delta", "--compacted"]))
    assert outcome.problems == []
    assert [(e["rows"], e["start"], e["end"]) for e in outcome.entries] == [(0, 0, survivors[0])]
    assert table_rows(empty) == []
    assert holdings(DeltaTable(str(empty)), name, [0]) == {0: [(0, survivors[0])]}


def test_a_table_on_an_object_store_other_than_s3_is_refused_before_spark_starts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """S3 (s3a://) tables are written (tests/spark/test_table_object_store.py); other stores are not tried."""
    code = ingest.main(
        ["--brokers", "127.0.0.1:1", "--ranges", document("s", (0, 0, 1)).dumps(),
         "--output", "gs://bucket/table", "--format", "delta"]
    )  # fmt: skip
    assert code == 2
    assert "a Delta table must be a local path (a plain path or a file: URI) or on S3" in caplog.text


def test_an_existing_table_of_another_shape_is_refused_before_spark_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A table made by something else (other columns or partitioning) failed only at the
    commit, after Spark had read and written everything, with delta-rs's own schema error."""
    import pyarrow as pa  # noqa: PLC0415
    from deltalake import write_deltalake  # noqa: PLC0415

    table = tmp_path / "orders"
    write_deltalake(str(table), pa.table({"order_id": [1, 2], "amount": [9.5, 3.0]}))
    code = ingest.main(
        ["--brokers", "127.0.0.1:1", "--ranges", document("s", (0, 0, 1)).dumps(),
         "--output", str(table), "--format", "delta"]
    )  # fmt: skip
    assert code == 2
    assert f"the Delta table {table} has columns (order_id long, amount double)" in caplog.text
    assert "this job writes (key binary, value binary" in caplog.text
    assert DeltaTable(str(table)).version() == 0, "nothing was committed to it"
    with pytest.raises(InvalidArgumentError, match="partitioned by"):
        delta_ingest.DeltaBatchWriter(str(table), "q").committed_batch()


def test_a_stream_writer_needs_a_query_name() -> None:
    for bad in ("", None, 7):
        with pytest.raises(InvalidArgumentError, match="query_name must be a non-empty string"):
            delta_ingest.DeltaBatchWriter("/tmp/t", bad)  # type: ignore[arg-type]


def test_a_stream_query_lands_each_micro_batch_once_even_when_spark_replays_one(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    """readStream + foreachBatch(DeltaBatchWriter): the batch id commits with the rows. The state a crash
    between the Delta commit and Spark's commit log leaves (offsets/N written, commits/N not) is made by
    deleting commits/N; the restarted query runs batch N again and the writer skips it."""
    name = f"delta-q-{uuid.uuid4().hex[:6]}"
    client.create_stream(name, name, partitions=2)
    publish(client, name, 0, 450)  # 900 messages
    table, checkpoint = tmp_path / "events", tmp_path / "checkpoint"
    writer = delta_ingest.DeltaBatchWriter(str(table), "events-ingest")
    calls: list[tuple[int, int]] = []

    def write(frame: Any, batch_id: int) -> None:
        calls.append((batch_id, frame.count()))
        writer(frame, batch_id)

    def run_query() -> None:
        run_available_now(spark, liftbridge_server.brokers, name, write, checkpoint, max_offsets=400)

    run_query()
    assert calls == [(0, 400), (1, 400), (2, 100)]
    assert writer.committed_batch() == 2
    assert table_rows(table) == expected((0, 0, 450), (1, 0, 450))
    # As if the driver died right after the Delta commit of batch 2 (the checksum file goes too, or Spark
    # takes the rewrite for another query's).
    (checkpoint / "commits" / "2").unlink()
    (checkpoint / "commits" / ".2.crc").unlink(missing_ok=True)
    publish(client, name, 450, 600)
    calls.clear()
    run_query()
    assert calls == [(2, 100), (3, 300)], "Spark ran batch 2 again (the writer skipped it), then the new messages"
    assert writer.committed_batch() == 3
    assert table_rows(table) == expected((0, 0, 600), (1, 0, 600)), "the replayed batch was not added twice"


def test_a_range_that_commits_after_a_later_range_of_its_partition_still_lands(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path
) -> None:
    """Ranges land in any order: [100, 200) then [0, 100) of the same partition leaves 0-199 once each (a table
    that kept only one "next offset" per partition took [0, 100) for held and wrote nothing, exiting 0). Then
    overlapping reruns of every shape add nothing, and a range reaching past a held middle part writes only the
    parts around it."""
    table = tmp_path / "orders"
    later = run_here(spark, liftbridge_server.brokers, document(stream, (0, 100, 150)), table)
    assert (later.problems, later.gaps) == ([], [])
    earlier = run_here(spark, liftbridge_server.brokers, document(stream, (0, 0, 100)), table)
    assert earlier.problems == []
    assert [(e["start"], e["end"], e["rows"]) for e in earlier.entries] == [(0, 100, 100)]
    assert table_rows(table) == expected((0, 0, 150))
    for start, end in ((0, 150), (20, 130), (0, 1), (149, 150)):
        again = run_here(spark, liftbridge_server.brokers, document(stream, (0, start, end)), table)
        assert (again.problems, again.entries) == ([], []), f"[{start}, {end}) is held: nothing written"
    run_here(spark, liftbridge_server.brokers, document(stream, (1, 50, 100)), table)
    around = run_here(spark, liftbridge_server.brokers, document(stream, (1, 0, 150)), table)
    assert [(e["partition"], e["start"], e["end"], e["rows"]) for e in around.entries] == [
        (1, 0, 50, 50),
        (1, 100, 150, 50),
    ], "both parts around the held middle, read in one run"
    assert table_rows(table) == expected((0, 0, 150), (1, 0, 150))


def test_a_gap_below_a_range_is_logged_and_fails_the_job_unless_data_loss_is_skipped(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """[0, 50) landed, then a run of [100, 150): offsets 50-99 are in no run's range. The run commits its own
    range (a rerun would find it held) but logs the gap and exits 1, so no one takes the lake for whole; with
    --on-data-loss skip it exits 0. (Before, the gap went into the result only, and the job exited 0.) The job
    runs here as spark-submit runs it after its input checks (``ingest.run_reported``)."""
    table = tmp_path / "gappy"
    brokers = ",".join(liftbridge_server.brokers)

    def status(ranges: RangesDocument, *extra: str) -> int:
        argv = ["--brokers", brokers, "--ranges", ranges.dumps(), "--output", str(table), "--format", "delta"]
        return ingest.run_reported(spark, ingest.parse_args([*argv, *extra]))

    assert status(document(stream, (0, 0, 50))) == 0, caplog.text
    caplog.clear()
    assert status(document(stream, (0, 100, 150))) == 1, caplog.text
    assert "partition 0: the lake misses offsets [50, 100)" in caplog.text
    assert table_rows(table) == expected((0, 0, 50), (0, 100, 150)), "the run's own range is committed"
    caplog.clear()
    assert status(document(stream, (0, 100, 150)), "--on-data-loss", "skip") == 0, caplog.text
    assert "partition 0: the lake misses offsets [50, 100)" in caplog.text, "still logged"


def test_a_stream_writer_skips_a_batch_0_that_another_writer_committed_meanwhile(
    spark: SparkSession, stream: str, liftbridge_server: DevServer, tmp_path: Path
) -> None:
    """Two writers of one query write micro-batch 0 at once (a zombie driver and its replacement): the one
    whose commit Delta refuses finds batch 0 committed and skips it. (Before, a committed batch 0 counted as
    "nothing committed", so the loser raised CommitFailedError.)"""
    table = str(tmp_path / "q")
    frame = (
        spark.read.format("liftbridge")
        .options(brokers=",".join(liftbridge_server.brokers), ranges=document(stream, (0, 0, 30)).dumps())
        .load()
    )
    ours, theirs = delta_ingest.DeltaBatchWriter(table, "q"), delta_ingest.DeltaBatchWriter(table, "q")
    raced: list[int] = []

    def the_other_commits_first(_: str) -> None:
        if not raced:
            raced.append(0)
            theirs(frame, 0)

    with fault_points.armed("delta.batch_written", the_other_commits_first):
        ours(frame, 0)
    assert raced == [0]
    assert ours.committed_batch() == 0
    assert table_rows(Path(table)) == expected((0, 0, 30)), "batch 0 once"


def test_vacuum_checkpoints_log_cleanup_and_compaction_keep_the_record_of_what_the_table_holds(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path
) -> None:
    """Table maintenance with the shortest retention: files compacted (OPTIMIZE), every unreferenced file
    vacuumed at once, a checkpoint, and the log before it cleaned up. The held offsets are application
    transactions, part of every snapshot and checkpoint, so a rerun of the same and of overlapping ranges
    adds only the new offsets (a per-partition marker that expires with the log would write them again)."""
    table = tmp_path / "maintained"
    brokers = liftbridge_server.brokers
    run_here(spark, brokers, document(stream, (0, 0, 100)), table)
    run_here(spark, brokers, document(stream, (0, 100, 150), (1, 0, 100)), table)
    delta = DeltaTable(str(table))
    delta.alter.set_table_properties(
        {"delta.logRetentionDuration": "interval 0 seconds", "delta.deletedFileRetentionDuration": "interval 0 seconds"}
    )
    delta = DeltaTable(str(table))
    delta.optimize.compact()
    delta = DeltaTable(str(table))
    delta.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    delta.create_checkpoint()
    delta.cleanup_metadata()
    assert not list((table / "_delta_log").glob("00000000000000000000.json")), "the log before the checkpoint is gone"
    again = run_here(spark, brokers, document(stream, (0, 0, 150), (1, 50, 150)), table)
    assert [(e["partition"], e["start"], e["end"]) for e in again.entries] == [(1, 100, 150)]
    assert table_rows(table) == expected((0, 0, 150), (1, 0, 150))
