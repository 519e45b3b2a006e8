"""A rerun whose ranges are all in the lake already decides so on the driver, before Spark (issue 50, item 5).

A held-out cluster trial saw a rerun with nothing to do start executors and unpack the 221 MB archive on every
worker (35 s), only to find every range landed. The job now reads each format's record of what it holds (the
Parquet claim ledger, Delta's application transactions, Iceberg's table properties) before it creates a
SparkSession, and when every range is held whole it reports as usual and exits 0. These tests run the rerun as
spark-submit runs it, with Spark's event log on: a run that starts a SparkContext leaves an application log,
and every Spark job it runs is a ``SparkListenerJobStart`` there.

A range only partly held, claimed but not committed, or committed but not published (a crashed run) is not
landed: the usual run follows and completes it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from liftbridge_provider import fault_points
from liftbridge_provider.client import LiftbridgeClient, PublishMessage
from liftbridge_provider.core.lake import Outcome
from liftbridge_provider.core.lake_ledger import Ledger
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.spark import ingest
from liftbridge_provider.spark.lake_store import HadoopStore
from liftbridge_provider.spark.landed import already_landed

SPARK_SUBMIT = str(Path(sys.executable).with_name("spark-submit"))
FORMATS = {"parquet": [], "delta": ["--format", "delta"], "iceberg": ["--format", "iceberg"]}
SUMMARY = re.compile(r"the lake holds (\d+) rows in (\d+) piece\(s\)")


@pytest.fixture(scope="module")
def stream(client: LiftbridgeClient) -> str:
    """Two partitions, offsets 0-199 each."""
    name = f"noop-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name, partitions=2)
    batch = [PublishMessage(f"p{p}-{n}".encode(), partition=p) for n in range(200) for p in range(2)]
    client.publish_batch(name, batch, ack_policy="all")
    return name


def arguments(server: DevServer, stream: str, span: tuple[int, int], output: Path, lake_format: str) -> list[str]:
    start, end = span
    document = RangesDocument(stream, tuple(OffsetRange(p, start, end) for p in range(2)))
    return ["--brokers", ",".join(server.brokers), "--ranges", document.dumps(), "--output", str(output),
            *FORMATS[lake_format]]  # fmt: skip


def submit(argv: list[str], events: Path) -> str:
    """The job under spark-submit on ``local[2]`` with Spark's event log in ``events``; its output (status 0)."""
    events.mkdir()
    command = [SPARK_SUBMIT, "--master", "local[2]", "--conf", f"spark.pyspark.python={sys.executable}",
               "--conf", "spark.ui.enabled=false", "--conf", "spark.eventLog.enabled=true",
               "--conf", "spark.eventLog.compress=false",
               "--conf", f"spark.eventLog.dir={events.as_uri()}", ingest.job_path(), *argv]  # fmt: skip
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    return output


def spark_jobs(events: Path) -> int:
    """The Spark jobs the event logs in ``events`` record (0 when no SparkContext started)."""
    return sum(
        path.read_text().count('"Event":"SparkListenerJobStart"') for path in events.rglob("*") if path.is_file()
    )


def landed(args: argparse.Namespace) -> Outcome | None:
    """What the job decides before Spark for ``args`` (None: it starts Spark), in this process."""
    return already_landed(args, ingest.load_ranges(args.ranges), os.environ)


def summary(output: str) -> tuple[int, int]:
    found = SUMMARY.findall(output)
    assert found, output[-3000:]
    rows, pieces = found[-1]
    return int(rows), int(pieces)


@pytest.mark.parametrize("lake_format", FORMATS)
def test_a_rerun_of_landed_ranges_starts_no_spark_and_reports_as_a_run_does(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path, lake_format: str
) -> None:
    argv = arguments(liftbridge_server, stream, (0, 100), tmp_path / "lake", lake_format)
    assert ingest.run_reported(spark, ingest.parse_args(argv)) == 0  # the first run lands the ranges
    output = submit(argv, tmp_path / "events")
    assert spark_jobs(tmp_path / "events") == 0, "the rerun ran Spark jobs"
    assert list((tmp_path / "events").iterdir()) == [], "the rerun started a SparkContext"
    assert "in the lake already" in output, output[-3000:]
    # what the usual path reports for these ranges now (it finds nothing to do either)
    usual = ingest.run(spark, ingest.parse_args(argv))
    assert summary(output) == (sum(e["rows"] for e in usual.entries), len(usual.entries))
    if lake_format == "parquet":
        assert summary(output) == (200, len(usual.entries))
        assert f"manifest {usual.manifest}" in output


@pytest.mark.parametrize("lake_format", FORMATS)
def test_a_range_partly_landed_is_not_landed_and_the_run_completes_it(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path, lake_format: str
) -> None:
    lake = tmp_path / "lake"
    ingest.run(spark, ingest.parse_args(arguments(liftbridge_server, stream, (0, 50), lake, lake_format)))
    wider = ingest.parse_args(arguments(liftbridge_server, stream, (0, 100), lake, lake_format))
    assert landed(wider) is None
    narrower = ingest.parse_args(arguments(liftbridge_server, stream, (10, 40), lake, lake_format))
    held = landed(narrower)
    assert held is not None
    assert held.problems == []
    assert ingest.run_reported(spark, wider) == 0
    assert landed(wider) is not None


def test_an_open_claim_is_not_landed(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path
) -> None:
    """Another run's claim (running, or crashed before its commit) leaves its offsets to the usual run."""
    lake = tmp_path / "lake"
    argv = arguments(liftbridge_server, stream, (0, 100), lake, "parquet")
    assert ingest.run_reported(spark, ingest.parse_args(argv)) == 0
    store = HadoopStore(spark, str(lake))
    Ledger(store, f"{store.root}/stream={stream}", 1, "another-run").claim(OffsetRange(1, 100, 120))
    wider = ingest.parse_args(arguments(liftbridge_server, stream, (0, 120), lake, "parquet"))
    assert landed(wider) is None
    assert landed(ingest.parse_args(argv)) is not None  # [0, 100) is whole


def test_a_run_that_crashed_between_commit_and_publish_is_completed_by_a_spark_submit_rerun(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path
) -> None:
    """Every claim committed, none published: the ledger says the offsets are decided, the lake's folders do
    not hold them yet. The rerun must publish them (the recovery path), not skip."""
    lake = tmp_path / "lake"
    argv = arguments(liftbridge_server, stream, (0, 100), lake, "parquet")
    with fault_points.armed("ingest.decided", fault_points._raise), pytest.raises(fault_points.FaultPointError):
        ingest.run(spark, ingest.parse_args(argv))
    assert landed(ingest.parse_args(argv)) is None
    output = submit(argv, tmp_path / "events")
    assert "in the lake already" not in output
    assert summary(output) == (200, summary(output)[1])
    rows = spark.read.parquet(f"{lake}/stream={stream}").select("partition", "offset").collect()
    assert sorted((r["partition"], r["offset"]) for r in rows) == [(p, o) for p in range(2) for o in range(100)]


def test_a_stream_other_than_the_documents_is_refused_even_when_the_lake_holds_the_ranges(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path
) -> None:
    """``--stream`` was checked in ``run`` only, after Spark started: a rerun that ends before Spark must
    still refuse a document of another stream (status 2), not report it landed."""
    argv = arguments(liftbridge_server, stream, (0, 20), tmp_path / "lake", "parquet")
    assert ingest.run_reported(spark, ingest.parse_args(argv)) == 0
    assert landed(ingest.parse_args(argv)) is not None
    assert ingest.main([*argv, "--stream", "another"]) == 2
