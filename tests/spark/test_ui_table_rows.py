"""The Liftbridge page's Runs view counts the rows the real ingest job landed in a Delta and an Iceberg table.

What this guards: the rows per range the page reads from a table's metadata (``ui/table_files.py``) are the
rows ``ingest.run`` wrote, for files Spark wrote (not stand-ins), in two partitions and two runs; and after
the Delta table is compacted (OPTIMIZE: each partition's files merged into one that straddles both runs'
ranges, the old files removed), the page still shows each run's own rows, neither more nor fewer.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from liftbridge_provider.client import LiftbridgeClient, PublishMessage
from liftbridge_provider.core.object_store import S3Settings
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.spark import ingest
from liftbridge_provider.ui import lake_records
from liftbridge_provider.ui.runs import IngestCall


def _run(spark: SparkSession, server: DevServer, ranges: RangesDocument, output: Path, lake_format: str) -> Any:
    args = ["--brokers", ",".join(server.brokers), "--ranges", ranges.dumps(), "--output", str(output)]
    outcome = ingest.run(spark, ingest.parse_args([*args, "--format", lake_format]))
    assert outcome.problems == []
    return outcome


def _page(output: Path, lake_format: str, ranges: RangesDocument) -> list[tuple[int, Any, Any, bool]]:
    """(partition, rows, offsets held, whole) of each range, as the Runs view reads them from the lake."""
    found = lake_records.read_record(IngestCall(str(output), lake_format, ranges), None)
    assert found.get("error") is None, found
    return [(r["partition"], r["rows"], r["offsets_held"], r["whole"]) for r in found["ranges"]]


@pytest.mark.parametrize("lake_format", ["delta", "iceberg"])
def test_the_runs_view_shows_the_rows_the_ingest_job_landed(
    spark: SparkSession, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path, lake_format: str
) -> None:
    name = f"ui-rows-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name, partitions=2)
    batch = [PublishMessage(f"p{p}-{n}".encode(), partition=p) for n in range(40) for p in range(2)]
    client.publish_batch(name, batch, ack_policy="all")
    output = tmp_path / lake_format
    first = RangesDocument(name, (OffsetRange(0, 0, 30), OffsetRange(1, 0, 20)))
    second = RangesDocument(name, (OffsetRange(0, 30, 40), OffsetRange(1, 20, 40)))
    for ranges in (first, second):
        outcome = _run(spark, liftbridge_server, ranges, output, lake_format)
        landed = {entry["partition"]: entry["rows"] for entry in outcome.entries}
        assert _page(output, lake_format, ranges) == [
            (r.partition, landed[r.partition], r.end - r.start, True) for r in ranges.ranges
        ]
    assert _page(output, lake_format, first) == [(0, 30, 30, True), (1, 20, 20, True)]

    if lake_format == "delta":
        metrics = DeltaTable(str(output)).optimize.compact()
        assert metrics["numFilesRemoved"] > metrics["numFilesAdded"] > 0
        assert _page(output, lake_format, first) == [(0, 30, 30, True), (1, 20, 20, True)]
        assert _page(output, lake_format, second) == [(0, 10, 10, True), (1, 20, 20, True)]


@pytest.mark.parametrize("lake_format", ["parquet", "delta"])
def test_the_runs_view_reads_a_lake_on_s3_with_the_aws_connections_settings(  # noqa: PLR0917 - fixtures
    s3a_spark: SparkSession,
    liftbridge_server: DevServer,
    client: LiftbridgeClient,
    s3_settings: S3Settings,
    s3_bucket: str,
    lake_format: str,
) -> None:
    """A lake in a bucket of the real S3 gateway: the page reads the Parquet claim ledger through pyarrow's S3
    filesystem, and the Delta log and its files' stats through delta-rs, with the settings an ``aws``
    connection gives (keys, endpoint, path style), and shows the rows each run landed; without them it says
    it needs them instead of reading anything."""
    name = f"ui-s3-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name, partitions=2)
    batch = [PublishMessage(f"p{p}-{n}".encode(), partition=p) for n in range(25) for p in range(2)]
    client.publish_batch(name, batch, ack_policy="all")
    output = f"s3a://{s3_bucket}/{lake_format}"
    ranges = RangesDocument(name, (OffsetRange(0, 0, 25), OffsetRange(1, 5, 25)))
    args = ["--brokers", ",".join(liftbridge_server.brokers), "--ranges", ranges.dumps(), "--output", output]
    outcome = ingest.run(s3a_spark, ingest.parse_args([*args, "--format", lake_format]))
    assert outcome.problems == []
    found = lake_records.read_record(IngestCall(output, lake_format, ranges), s3_settings)
    assert found.get("error") is None, found
    assert [(r["partition"], r["rows"], r["whole"]) for r in found["ranges"]] == [(0, 25, True), (1, 20, True)]
    with pytest.raises(ValueError, match="settings"):
        lake_records.read_record(IngestCall(output, lake_format, ranges), None)
