"""Exactly-once, the lake side: every offset lands in the lake once, whatever ranges overlap.

Real Spark (``local[2]`` and ``spark-submit``), a real Liftbridge server, the
real local filesystem. Two ingests of overlapping ranges of one stream, one
after the other or at the same time, and a rerun after a crash at each step
between claim and publish, must leave each offset exactly once in
``spark.read.parquet(OUTPUT/stream=<s>)``.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from liftbridge_provider import fault_points
from liftbridge_provider.client import BeyondHighWatermarkError, LiftbridgeClient
from liftbridge_provider.core.lake import LakeError, check_ledger, holdings
from liftbridge_provider.core.lake_ledger import Ledger
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.spark import ingest
from liftbridge_provider.spark.lake_store import HadoopStore, _link_exclusive

ROOT = Path(__file__).resolve().parents[2]
INGEST = ROOT / "spark_jobs" / "ingest.py"  # what spark-submit runs: it calls the job module's main
JOB_MODULE = ROOT / "liftbridge_provider" / "spark" / "ingest.py"
SPARK_SUBMIT = str(Path(sys.executable).with_name("spark-submit"))
ONE_PIECE_PER_RANGE = ["--min-partitions", "1"]  # a range's new offsets make one piece: its folder is the range
SPARK_ENV = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}


@pytest.fixture(scope="module")
def stream(client: LiftbridgeClient) -> str:
    """One partition, offsets 0-299."""
    name = f"lake-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name)
    client.publish_batch(name, [f"v{i}".encode() for i in range(300)], ack_policy="all")
    return name


def document(stream: str, start: int, end: int) -> RangesDocument:
    return RangesDocument(stream, (OffsetRange(0, start, end),))


def run_submit(
    brokers: list[str], ranges: RangesDocument, output: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    command = [
        SPARK_SUBMIT, "--master", "local[2]", "--conf", f"spark.pyspark.python={sys.executable}",
        "--conf", "spark.ui.enabled=false", str(INGEST), "--brokers", ",".join(brokers),
        "--ranges", ranges.dumps(), "--output", str(output), *ONE_PIECE_PER_RANGE,
    ]  # fmt: skip
    return subprocess.run(
        command, env={**SPARK_ENV, **(env or {})}, capture_output=True, text=True, timeout=600, check=False
    )


class SimulatedCrash(BaseException):
    """Raised at a crash point in this process: nothing of the job runs after it, as after a kill."""


def run_here(
    spark: SparkSession,
    brokers: list[str],
    ranges: RangesDocument,
    output: Path,
    store: HadoopStore | None = None,
    *,
    crash_at: str | None = None,
) -> Any:
    """The job's ``run`` in this process, on the test's Spark session (threads may call it at once); with
    ``crash_at``, it stops at that fault point of the job as a killed driver would."""
    argv = ["--brokers", ",".join(brokers), "--ranges", ranges.dumps(), "--output", str(output), *ONE_PIECE_PER_RANGE]
    args = ingest.parse_args(argv)
    if crash_at is None:
        return ingest.run(spark, args, store=store)

    def crash(name: str) -> None:
        raise SimulatedCrash(name)

    with fault_points.armed(f"ingest.{crash_at}", crash):
        return ingest.run(spark, args, store=store)


def lake_offsets(spark: SparkSession, output: Path, stream: str) -> list[int]:
    frame = spark.read.parquet(str(output / f"stream={stream}"))
    return sorted(row.offset for row in frame.select("offset").collect())


def duplicates(offsets: list[int]) -> dict[int, int]:
    return {offset: n for offset, n in Counter(offsets).items() if n > 1}


def range_folders(output: Path, stream: str) -> list[str]:
    return sorted(p.name for p in (output / f"stream={stream}" / "partition=0").glob("range=*"))


def test_overlapping_ranges_one_after_the_other_write_each_offset_once(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path
) -> None:
    """range=0-100 then range=0-150 (a re-freeze after a failed commit) used to leave
    rows 0-99 twice in the lake. Now the second run writes only 100-149; reruns add nothing."""
    output = tmp_path / "lake"
    for start, end in ((0, 100), (0, 150)):
        result = run_submit(liftbridge_server.brokers, document(stream, start, end), output)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        offsets = lake_offsets(spark, output, stream)
        assert duplicates(offsets) == {}, f"after range {start}-{end}"
        assert offsets == list(range(end))
    for start, end in ((0, 100), (40, 120), (0, 150)):
        outcome = run_here(spark, liftbridge_server.brokers, document(stream, start, end), output)
        assert outcome.problems == []
        assert [(e["start"], e["end"]) for e in outcome.entries] == [p for p in [(0, 100), (100, 150)] if p[0] < end]
    assert lake_offsets(spark, output, stream) == list(range(150))
    assert range_folders(output, stream) == ["range=0-100", "range=100-150"]
    store = HadoopStore(spark, str(output))
    pieces = holdings(Ledger(store, f"{store.root}/stream={stream}", 0, "reader").claims())
    assert [(c.start, c.end, c.commit.rows if c.commit else None) for c in pieces] == [(0, 100, 100), (100, 150, 50)]


def test_overlapping_ranges_at_the_same_time_write_each_offset_once(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path
) -> None:
    """Three concurrent runs (two DAG runs and a re-freeze) read the empty ledger at once,
    then race for the same claim; each offset of 0-199 must still land once."""
    output = tmp_path / "lake"
    ranges = [(0, 100), (0, 150), (50, 200)]
    barrier = threading.Barrier(len(ranges), timeout=120)

    class RacingStore(HadoopStore):
        """Holds every run's first create until all runs reach it: they all try to create claim 0."""

        first = threading.local()

        def create_exclusive(self, path: str, data: bytes) -> bool:
            if not getattr(self.first, "done", False):
                self.first.done = True
                barrier.wait()
            return super().create_exclusive(path, data)

    store = RacingStore(spark, str(output))
    with concurrent.futures.ThreadPoolExecutor(len(ranges)) as pool:
        outcomes = list(
            pool.map(lambda r: run_here(spark, liftbridge_server.brokers, document(stream, *r), output, store), ranges)
        )
    assert [o.problems for o in outcomes] == [[], [], []]
    offsets = lake_offsets(spark, output, stream)
    assert duplicates(offsets) == {}
    assert offsets == list(range(200))
    claims = Ledger(store, f"{store.root}/stream={stream}", 0, "reader").claims()
    check_ledger(claims)
    assert all(c.committed for c in claims)
    assert sorted(o for c in claims for o in range(c.start, c.end)) == list(range(200))
    assert not list((output / f"stream={stream}" / "_staging").glob("*")), "every run removed its staged folders"


def check_crashed_state(output: Path, stream: str, point: str) -> None:
    folder = output / f"stream={stream}"
    assert (folder / "_ledger" / "partition=0" / "claim-0000000000.json").is_file()
    assert (folder / "_ledger" / "partition=0" / "claim-0000000000.commit.json").is_file() == (point == "decided")
    staged = list(folder.glob("_staging/*/p=0-claim=0-*.parquet")) + list(folder.glob("_staging/*/p=0/claim=0"))
    assert bool(staged) == (point != "claimed")  # the tasks' object, or Spark writer's folder
    assert not (folder / "partition=0" / "range=0-100").exists(), "nothing published before the crash"


def check_repaired(spark: SparkSession, brokers: list[str], output: Path, stream: str) -> None:
    outcome = run_here(spark, brokers, document(stream, 0, 150), output)
    assert outcome.problems == []
    offsets = lake_offsets(spark, output, stream)
    assert duplicates(offsets) == {}
    assert offsets == list(range(150))
    assert range_folders(output, stream) == ["range=0-100", "range=100-150"]


def test_a_rerun_after_the_driver_is_killed_after_claiming_leaves_each_offset_once(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path
) -> None:
    """spark-submit's driver dies (os._exit, as a kill) between claim and data write;
    the rerun (an Airflow retry, here of a bigger range) writes the open piece, once."""
    output = tmp_path / "lake"
    crashed = run_submit(
        liftbridge_server.brokers, document(stream, 0, 100), output, env={fault_points.ENV: "ingest.claimed=exit"}
    )
    assert crashed.returncode == 75, "the job crashed after claiming: " + crashed.stderr[-3000:]
    check_crashed_state(output, stream, "claimed")
    check_repaired(spark, liftbridge_server.brokers, output, stream)


@pytest.mark.parametrize("point", ["staged", "decided"])
def test_a_rerun_after_a_crash_before_publishing_leaves_each_offset_once(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path, point: str
) -> None:
    """The job stops after staging the rows (not committed: the rerun writes the piece
    again) or after committing but before the rename (the rerun finishes the rename)."""
    output = tmp_path / "lake"
    with pytest.raises(SimulatedCrash):
        run_here(spark, liftbridge_server.brokers, document(stream, 0, 100), output, crash_at=point)
    check_crashed_state(output, stream, point)
    check_repaired(spark, liftbridge_server.brokers, output, stream)


def test_the_hadoop_create_path_fences_too(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path
) -> None:
    """The code path of non-local schemes (Hadoop create(overwrite=false) and rename),
    run one writer after the other on file: paths, trims and publishes the same way."""
    output = tmp_path / "lake"
    store = HadoopStore(spark, f"file://{output}", atomic_local=False)
    assert not store.local
    for start, end in ((0, 100), (0, 150), (0, 150)):
        outcome = run_here(spark, liftbridge_server.brokers, document(stream, start, end), output, store)
        assert outcome.problems == []
    assert lake_offsets(spark, output, stream) == list(range(150))
    assert range_folders(output, stream) == ["range=0-100", "range=100-150"]


def _race(path: str, tag: str, start_at: float) -> bool:
    time.sleep(max(0.0, start_at - time.time()))
    return _link_exclusive(path, tag.encode())


def test_exclusive_create_has_one_winner_across_processes(tmp_path: Path) -> None:
    """The local create-if-absent that claims rely on: 4 processes race for each of 100
    files; exactly one wins each, and the file holds the winner's whole content. (Hadoop's own
    create(overwrite=false) on file: paths let both of two threads win 70 of 500 such races.)"""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(4, mp_context=context) as pool:
        list(pool.map(time.sleep, [0.1] * 4))  # start the workers before timing the races
        for index in range(100):
            path = str(tmp_path / f"claim-{index:010d}.json")
            start_at = time.time() + 0.05
            tags = [f"writer-{w}-" + "x" * 4096 for w in range(4)]
            wins = list(pool.map(_race, [path] * 4, tags, [start_at] * 4))
            assert wins.count(True) == 1, f"race {index}: {wins}"
            assert Path(path).read_text() == tags[wins.index(True)]
    assert not list(tmp_path.glob(".*.tmp")), "temporary files are removed"


def test_a_range_beyond_the_high_watermark_is_refused_before_anything_is_claimed(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path
) -> None:
    """A mistyped end ([100, 10**12) for a partition at 300) was claimed before the read refused it; the open
    claim then had to be written whole by every later run that overlapped it, so a correct [100, 200) failed
    until the stream reached offset 10**12. The job now refuses such a range before it claims anything: the
    lake stays empty, and the correct range lands."""
    output = tmp_path / "lake"
    with pytest.raises(BeyondHighWatermarkError, match=r"\[100, 1000000000000\)"):
        run_here(spark, liftbridge_server.brokers, document(stream, 100, 10**12), output)
    assert not list(output.rglob("_ledger/*")), "nothing was claimed"
    outcome = run_here(spark, liftbridge_server.brokers, document(stream, 100, 200), output)
    assert outcome.problems == []
    assert lake_offsets(spark, output, stream) == list(range(100, 200))


def test_among_many_partitions_the_first_range_beyond_its_high_watermark_is_named_and_nothing_is_claimed(
    spark: SparkSession, client: LiftbridgeClient, liftbridge_server: DevServer, tmp_path: Path
) -> None:
    """The job asks every partition's high watermark at once; two of twelve ranges end beyond theirs. The
    error names the first of them in the document's order, as a check of one range after the other did, and
    no partition's ledger holds a claim; the good ranges then land."""
    name = f"ends-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name, partitions=12)
    for partition in range(12):
        client.publish_batch(name, [b"x"] * 20, partition=partition, ack_policy="all")
    bad = {5: 10**9, 9: 21}
    ranges = tuple(OffsetRange(p, 0, bad.get(p, 20)) for p in range(12))
    output = tmp_path / "lake"
    argv = ["--brokers", ",".join(liftbridge_server.brokers), "--output", str(output)]
    with pytest.raises(BeyondHighWatermarkError, match=r"^partition 5: range \[0, 1000000000\) goes beyond"):
        ingest.run(spark, ingest.parse_args([*argv, "--ranges", RangesDocument(name, ranges).dumps()]))
    assert not list(output.rglob("_ledger/*")), "nothing was claimed"
    good = RangesDocument(name, tuple(OffsetRange(p, 0, 20) for p in range(12)))
    outcome = ingest.run(spark, ingest.parse_args([*argv, "--ranges", good.dumps()]))
    assert outcome.problems == []
    assert len(lake_offsets(spark, output, name)) == 240


@pytest.mark.parametrize("marks", ["%3D", "#", "?"], ids=["percent", "hash", "question-mark"])
def test_a_stream_name_with_uri_characters_keeps_its_ledger_in_its_own_folder(
    spark: SparkSession, client: LiftbridgeClient, liftbridge_server: DevServer, tmp_path: Path, marks: str
) -> None:
    """Stream names may hold '%', '#' and '?'. The ledger's exclusive creates on a local lake went to the path
    read back as a URI (decoded twice, cut at '#' or '?'), not to the folder Hadoop lists: 'a%3Db' claimed in
    stream 'a=b''s ledger and the run never saw its own claim. The data and the ledger now sit under the
    stream's literal name, each offset once."""
    name = f"lake{marks}{uuid.uuid4().hex[:6]}"
    client.create_stream(f"lake.{uuid.uuid4().hex[:8]}", name)
    client.publish_batch(name, [f"v{i}".encode() for i in range(50)], ack_policy="all")
    output = tmp_path / "lake"
    outcome = run_here(spark, liftbridge_server.brokers, document(name, 0, 50), output)
    assert outcome.problems == []
    assert sorted(p.name for p in output.iterdir()) == [f"stream={name}"], "nothing outside the stream's folder"
    assert list((output / f"stream={name}" / "_ledger").rglob("checkpoint-*")), "the ledger is the stream's own"
    assert lake_offsets(spark, output, name) == list(range(50))


def test_a_pieces_rows_and_offset_bounds_read_from_its_footers_agree_on_both_paths(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A committed piece's rows and offsets come from its files' footers: pyarrow's reader on local folders,
    Parquet's JVM reader elsewhere. Both must give the same numbers (several files, several row groups, an
    empty file) and refuse a file whose row groups keep no offset statistics, since its rows could not be
    checked against the claim."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    folder = tmp_path / "piece"
    spark.range(40, 1040).withColumnRenamed("id", "offset").repartition(3).write.parquet(str(folder))
    pq.write_table(pa.table({"offset": pa.array([7, 3, 2000], pa.int64())}), folder / "extra.parquet", row_group_size=2)
    pq.write_table(pa.table({"offset": pa.array([], pa.int64())}), folder / "empty.parquet")
    local, hadoop = HadoopStore(spark, str(tmp_path)), HadoopStore(spark, str(tmp_path), atomic_local=False)
    assert local.local
    assert not hadoop.local
    expected = (1003, 3, 2000)
    assert tuple(local.parquet_stats(str(folder), "offset")) == expected
    assert tuple(hadoop.parquet_stats(str(folder), "offset")) == expected
    pq.write_table(pa.table({"offset": pa.array([5], pa.int64())}), folder / "bare.parquet", write_statistics=False)
    for store in (local, hadoop):
        with pytest.raises(LakeError, match="keeps no offset statistics for 1 rows"):
            store.parquet_stats(str(folder), "offset")
