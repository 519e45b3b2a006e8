"""The ingest job into Apache Iceberg (``--format iceberg``): each offset lands exactly once for ranges in any
order, overlapping, retried, committed at the same moment, and after the table's maintenance (every old
snapshot expired, every data file rewritten). Real server, real Spark, pyiceberg's SQL catalog on SQLite."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.catalog.sql import SqlCatalogBaseTable
from pyiceberg.table import Table
from pyspark.sql import SparkSession
from sqlalchemy import create_engine, event

from liftbridge_provider import fault_points
from liftbridge_provider.client import LiftbridgeClient, PublishMessage
from liftbridge_provider.core.iceberg_plan import RETRY_PROPERTY
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.spark import ingest
from liftbridge_provider.spark.iceberg_ingest import IcebergFormat, catalog_properties


@pytest.fixture(scope="module")
def stream(liftbridge_server: DevServer) -> str:
    """Two partitions, offsets 0-199 each; the value names its partition and offset."""
    name = f"ice-{uuid.uuid4().hex[:8]}"
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        client.create_stream(name, name, partitions=2)
        batch = [PublishMessage(f"p{p}-{n}".encode(), partition=p) for n in range(200) for p in range(2)]
        client.publish_batch(name, batch, ack_policy="all")
    return name


def document(stream: str, *ranges: tuple[int, int, int]) -> RangesDocument:
    return RangesDocument(stream, tuple(OffsetRange(p, s, e) for p, s, e in ranges))


def run_here(spark: SparkSession, brokers: list[str], ranges: RangesDocument, warehouse: Path) -> Any:
    args = ["--brokers", ",".join(brokers), "--ranges", ranges.dumps(), "--output", str(warehouse)]
    return ingest.run(spark, ingest.parse_args([*args, "--format", "iceberg"]))


def table_of(warehouse: Path, stream: str) -> Table:
    catalog = load_catalog(
        "liftbridge", type="sql", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}"
    )
    return catalog.load_table(f"liftbridge.{stream.replace('-', '_')}")


def table_rows(warehouse: Path, stream: str) -> list[tuple[int, int, bytes]]:
    data = table_of(warehouse, stream).scan(selected_fields=("partition", "offset", "value")).to_arrow()
    return sorted((r["partition"], r["offset"], r["value"]) for r in data.to_pylist())


def expected(*ranges: tuple[int, int, int]) -> list[tuple[int, int, bytes]]:
    return sorted((p, n, f"p{p}-{n}".encode()) for p, s, e in ranges for n in range(s, e))


def test_ranges_in_any_order_overlapping_and_around_a_held_middle_land_once(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path
) -> None:
    warehouse = tmp_path / "wh"
    brokers = liftbridge_server.brokers
    later = run_here(spark, brokers, document(stream, (0, 100, 150), (1, 50, 100)), warehouse)
    assert later.problems == []
    earlier = run_here(spark, brokers, document(stream, (0, 0, 100)), warehouse)
    assert [(e["partition"], e["start"], e["end"], e["rows"]) for e in earlier.entries] == [(0, 0, 100, 100)]
    around = run_here(spark, brokers, document(stream, (1, 0, 200)), warehouse)
    assert [(e["start"], e["end"], e["rows"]) for e in around.entries] == [(0, 50, 50), (100, 200, 100)]
    for start, end in ((0, 150), (20, 130)):
        again = run_here(spark, brokers, document(stream, (0, start, end), (1, 0, 200)), warehouse)
        assert (again.problems, again.entries) == ([], []), f"[{start}, {end}) is held: nothing written"
    assert table_rows(warehouse, stream) == expected((0, 0, 150), (1, 0, 200))
    table = table_of(warehouse, stream)
    assert table.properties[RETRY_PROPERTY] == "0"
    assert [f.name for f in table.spec().fields] == ["partition"]


def test_two_runs_committing_at_once_and_a_run_dying_before_its_commit_leave_each_offset_once(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path
) -> None:
    """Two runs of overlapping ranges write their files, then commit at the same moment: Iceberg refuses the
    second (its base moved), which plans again and writes only what is missing. Then a run dies after
    writing and before committing (its files are in no snapshot); its retry lands the range once."""
    warehouse = tmp_path / "wh"
    brokers = liftbridge_server.brokers
    run_here(spark, brokers, document(stream, (0, 0, 10)), warehouse)  # the table exists before the race
    both_written = threading.Barrier(2, timeout=120)
    outcomes: list[Any] = []
    errors: list[BaseException] = []

    def one_run(ranges: RangesDocument) -> None:
        try:
            outcomes.append(run_here(spark, brokers, ranges, warehouse))
        except BaseException as exc:  # shown by the assertion below
            errors.append(exc)

    first_only: list[int] = []

    def meet_once(_: str) -> None:
        if len(first_only) < 2:  # only each run's first commit waits for the other's
            first_only.append(1)
            both_written.wait()

    runs = [
        threading.Thread(target=one_run, args=(document(stream, (0, 0, 60), (1, 0, 90)),)),
        threading.Thread(target=one_run, args=(document(stream, (0, 40, 120), (1, 90, 130)),)),
    ]
    with fault_points.armed("ingest.table_written", meet_once):
        for thread in runs:
            thread.start()
        for thread in runs:
            thread.join(300)
    assert errors == []
    assert [o.problems for o in outcomes] == [[], []]
    assert table_rows(warehouse, stream) == expected((0, 0, 120), (1, 0, 130))

    def die(_: str) -> None:
        raise RuntimeError("the driver dies here")

    with fault_points.armed("ingest.table_written", die), pytest.raises(RuntimeError, match="dies here"):
        run_here(spark, brokers, document(stream, (0, 120, 200)), warehouse)
    assert table_rows(warehouse, stream) == expected((0, 0, 120), (1, 0, 130)), "nothing of the dead run"
    run_here(spark, brokers, document(stream, (0, 100, 200)), warehouse)
    rows = table_rows(warehouse, stream)
    assert rows == expected((0, 0, 200), (1, 0, 130))
    assert max(Counter((p, o) for p, o, _ in rows).values()) == 1


def test_expiring_every_old_snapshot_and_rewriting_every_file_keeps_the_record_of_what_the_table_holds(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path
) -> None:
    """Table maintenance: every snapshot but the current one expired, every data file rewritten (a
    compaction: the table overwritten with its own rows, so no file of the ingest is left). The held
    offsets live in the table's properties, not in a snapshot, so a rerun of the same and of overlapping
    ranges adds only the new offsets (Iceberg sinks that keep their marker in a snapshot summary lose it
    to snapshot expiry and write everything again)."""
    warehouse = tmp_path / "wh"
    brokers = liftbridge_server.brokers
    run_here(spark, brokers, document(stream, (0, 0, 100)), warehouse)
    run_here(spark, brokers, document(stream, (0, 100, 150), (1, 0, 100)), warehouse)
    table = table_of(warehouse, stream)
    rewritten = table.scan().to_arrow()
    table.overwrite(rewritten)  # every data file rewritten
    table = table_of(warehouse, stream)
    current = table.current_snapshot()
    assert current is not None
    table.maintenance.expire_snapshots().by_ids(
        [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current.snapshot_id]
    ).commit()
    assert len(table_of(warehouse, stream).snapshots()) == 1
    again = run_here(spark, brokers, document(stream, (0, 0, 150), (1, 50, 150)), warehouse)
    assert [(e["partition"], e["start"], e["end"]) for e in again.entries] == [(1, 100, 150)]
    assert table_rows(warehouse, stream) == expected((0, 0, 150), (1, 0, 150))


def test_a_table_that_retries_lost_commits_is_refused_before_spark_starts(tmp_path: Path) -> None:
    """A writer that re-applies a lost commit to the new table would set held offsets planned from the old
    one: a table whose commit.retry.num-retries is not 0 is refused, naming the property, before Spark."""
    warehouse = tmp_path / "wh"
    warehouse.mkdir()
    catalog = load_catalog(
        "liftbridge", type="sql", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}"
    )
    catalog.create_namespace("liftbridge")
    from liftbridge_provider.spark.reader import arrow_schema  # noqa: PLC0415

    catalog.create_table("liftbridge.orders", schema=arrow_schema())
    code = ingest.main(
        ["--brokers", "127.0.0.1:1", "--ranges", document("orders", (0, 0, 1)).dumps(),
         "--output", str(warehouse), "--format", "iceberg"]
    )  # fmt: skip
    assert code == 2
    assert catalog.load_table("liftbridge.orders").current_snapshot() is None, "nothing committed"


def test_two_first_runs_that_create_a_new_sql_catalog_at_once_both_load_it(tmp_path: Path) -> None:
    """Issue 50, item 1: pyiceberg checks whether a SQL catalog's tables exist, then creates them, so two first
    runs on a new catalog file both found none and one failed on "table iceberg_tables already exists" (1 in 10
    two-process trials). Here the other run creates them exactly between that check and this run's create."""
    properties = catalog_properties(str(tmp_path / "wh"), {})
    raced: list[int] = []

    def the_other_run_creates_them_first(*_: Any, **__: Any) -> None:
        if not raced:
            raced.append(1)
            SqlCatalogBaseTable.metadata.create_all(create_engine(properties["uri"]))

    event.listen(SqlCatalogBaseTable.metadata, "before_create", the_other_run_creates_them_first)
    try:
        catalog = IcebergFormat("liftbridge", properties, "liftbridge.orders").catalog()
    finally:
        event.remove(SqlCatalogBaseTable.metadata, "before_create", the_other_run_creates_them_first)
    assert raced == [1]
    assert catalog.list_namespaces() == []


def test_a_file_uri_and_a_plain_path_name_the_same_embedded_catalog(tmp_path: Path) -> None:
    """Issue 50, item 2: ``--output file:/lake/wh`` put the catalog at ``<cwd>/file:/lake/wh/catalog.db``, so the
    table a run saw depended on spark-submit's working folder."""
    plain = catalog_properties(str(tmp_path / "wh"), {})
    assert plain == {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/wh/catalog.db",
        "warehouse": f"file://{tmp_path}/wh",
    }
    for uri in (f"file:{tmp_path}/wh", f"file://{tmp_path}/wh"):
        assert catalog_properties(uri, {}) == plain, uri


def test_a_warehouse_on_object_storage_needs_a_catalog_named_before_spark_starts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A SQLite file cannot live in a bucket: an s3a:// warehouse without a catalog is refused, saying which
    catalogs work; so are S3 settings given as catalog properties (they have one source)."""
    ranges = document("orders", (0, 0, 1)).dumps()
    base = ["--brokers", "127.0.0.1:1", "--ranges", ranges, "--output", "s3a://lake/wh", "--format", "iceberg"]
    assert ingest.main(base) == 2
    assert "needs a catalog, and a SQLite catalog cannot live in a bucket" in caplog.text
    caplog.clear()
    given = ["--iceberg-catalog-property", "type=rest", "--iceberg-catalog-property", "s3.secret-access-key=x"]
    assert ingest.main([*base, *given]) == 2
    assert "the S3 settings come from one source" in caplog.text
