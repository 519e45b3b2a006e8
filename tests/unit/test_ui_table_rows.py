"""The Runs view's rows per range of Delta and Iceberg lakes, counted from the tables' own metadata.

What these guard: a range's rows come from the table's live data files (Delta's add actions with their stats,
Iceberg's current snapshot), a file wholly inside the range counts its recorded row count, a file that
straddles the range's boundary is counted exactly from its offset column, a removed (compacted) file is not
counted, no row is counted twice, and a file the metadata cannot decide on makes the rows unknown with the
reason instead of a guess. The pure rules have a table of cases; the tables are real ones (delta-rs, pyiceberg
with its SQL catalog in a temporary folder), committed by the ingest job's own helpers (``delta_ingest``'s
add actions and commit, ``IcebergFormat.commit``) with the Parquet files pyarrow writes where Spark would.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from liftbridge_provider.core.delta_plan import ledger_versions
from liftbridge_provider.core.ranges import RangesDocument
from liftbridge_provider.core.table_plan import Interval, TablePlan
from liftbridge_provider.ui import bounds, lake_records
from liftbridge_provider.ui.file_counts import DataFile, RangeFiles, files_over, settle
from liftbridge_provider.ui.runs import IngestCall
from liftbridge_provider.ui.table_files import rows_in_file

STREAM = "orders.eu-1"  # a name with a dot and a dash: the Iceberg table is liftbridge.orders_eu_1


F = DataFile  # (path, partition, rows, lowest offset, highest offset, problem)


# (what it guards, files, (partition, start, end), (rows, pieces, straddling paths), words of the reason or None)
CASES: list[tuple[str, list[DataFile], tuple[int, int, int], tuple[int, int, tuple[str, ...]], str | None]] = [
    ("a file wholly inside counts its row count", [F("a", 0, 10, 0, 9)], (0, 0, 10), (10, 1, ()), None),
    ("a compacted stream's file counts its rows, not its offsets", [F("a", 0, 7, 0, 9)], (0, 0, 10), (7, 1, ()), None),
    ("a file of another partition counts nothing", [F("a", 1, 10, 0, 9)], (0, 0, 10), (0, 0, ()), None),
    (
        "files just below and just above the range count nothing, one exactly on it counts",
        [F("below", 0, 10, 0, 9), F("above", 0, 10, 20, 29), F("on", 0, 10, 10, 19)],
        (0, 10, 20),
        (10, 1, ()),
        None,
    ),
    ("a file over the range's start straddles", [F("a", 0, 20, 0, 19)], (0, 10, 30), (0, 0, ("a",)), None),
    ("a file over the range's end straddles", [F("a", 0, 20, 20, 39)], (0, 10, 30), (0, 0, ("a",)), None),
    ("a file wider than the range on both sides straddles", [F("a", 0, 100, 0, 99)], (0, 10, 20), (0, 0, ("a",)), None),
    (
        "a file whose partition is not recorded is read, even when its offsets are inside",
        [F("a", None, 10, 0, 9), F("b", None, 10, 50, 59)],
        (0, 0, 10),
        (0, 0, ("a",)),
        None,
    ),
    ("an empty file counts nothing, with or without bounds", [F("a", 0, 0, None, None)], (0, 0, 10), (0, 0, ()), None),
    ("a file without a row count: rows unknown", [F("a", 0, None, 0, 9)], (0, 0, 10), (0, 0, ()), "data file a has no"),
    (
        "a file without offset bounds: rows unknown",
        [F("a", 0, 10, None, None)],
        (0, 0, 10),
        (0, 0, ()),
        "offset bounds",
    ),
    (
        "a file without stats in another partition does not matter",
        [F("a", 1, None, None, None)],
        (0, 0, 10),
        (0, 0, ()),
        None,
    ),
    (
        "row-level deletes on a file over the range: rows unknown",
        [F("ok", 0, 5, 0, 4), F("a", 0, 10, 5, 14, "2 delete file(s)")],
        (0, 0, 10),
        (0, 0, ()),
        "data file a: 2 delete file(s)",
    ),
    (
        "row-level deletes on a file outside the range do not matter",
        [F("a", 0, 10, 20, 29, "dv")],
        (0, 0, 10),
        (0, 0, ()),
        None,
    ),
    (
        "two files inside and one straddling: inside counted from metadata, the other left to read",
        [F("x", 0, 10, 0, 9), F("y", 0, 10, 10, 19), F("z", 0, 10, 15, 24), F("p1", 1, 99, 0, 98)],
        (0, 0, 20),
        (20, 2, ("z",)),
        None,
    ),
]


@pytest.mark.parametrize(("guards", "files", "over", "expected", "reason"), CASES, ids=[c[0] for c in CASES])
def test_files_over_a_range(
    guards: str,
    files: list[DataFile],
    over: tuple[int, int, int],
    expected: tuple[int, int, tuple[str, ...]],
    reason: str | None,
) -> None:
    counted = files_over(files, *over)
    if reason is None:
        assert counted.unknown is None, guards
        assert (counted.rows, counted.pieces, tuple(f.path for f in counted.straddling)) == expected, guards
    else:
        assert counted.unknown is not None, guards
        assert reason in counted.unknown, (guards, counted.unknown)


def test_settling_adds_each_straddling_files_exact_rows_and_counts_it_only_when_it_has_some() -> None:
    counted = RangeFiles(20, 2, (F("z", 0, 10, 15, 24), F("w", 0, 10, 19, 40)), None)
    assert settle(counted, {"z": 5, "w": 0}) == (25, 3)
    with pytest.raises(KeyError):  # a straddling file left uncounted is an error, never a zero
        settle(counted, {"z": 5})


def _rows(partition: int, offsets: list[int]) -> pa.Table:
    """Rows of the ingest job's schema (``spark/reader.SCHEMA``) at ``offsets`` of ``partition``."""
    from liftbridge_provider.spark.reader import arrow_schema  # noqa: PLC0415

    schema = arrow_schema()
    columns = {field.name: pa.nulls(len(offsets), field.type) for field in schema}
    columns["stream"] = pa.array([STREAM] * len(offsets))
    columns["partition"] = pa.array([partition] * len(offsets), pa.int32())
    columns["offset"] = pa.array(offsets, pa.int64())
    return pa.table(columns, schema=schema)


def test_a_files_exact_rows_are_read_from_its_offset_column(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    table = pa.concat_tables([_rows(0, list(range(0, 10))), _rows(1, list(range(5, 12)))])
    pq.write_table(table, path, row_group_size=4)  # several row groups: some skipped by their statistics
    assert rows_in_file(str(path), None, 3, 8) == 5 + 3  # both partitions' offsets 3..7
    assert rows_in_file(str(path), 1, 3, 8) == 3  # the partition column filters when asked
    assert rows_in_file(str(path), 0, 100, 200) == 0


def _delta_run(root: Path, name: str, files: dict[int, list[list[int]]], held: dict[int, list[Interval]]) -> None:
    """One ingest run's commit as ``delta_ingest.DeltaFormat`` makes it: Parquet files where Spark writes them
    (``<table>/<name>/partition=<p>/``, without the partition column, as ``partitionBy`` writes them), their
    add actions with stats from the footers (``add_actions``), committed with the partitions' intervals as
    liftbridge application transactions in one Delta transaction (``_commit``)."""
    from liftbridge_provider.spark import delta_ingest  # noqa: PLC0415

    table = delta_ingest._open(str(root))
    for partition, chunks in files.items():
        folder = root / name / f"partition={partition}"
        folder.mkdir(parents=True)
        for index, offsets in enumerate(chunks):
            file = folder / f"part-{index:05d}.parquet"
            pq.write_table(_rows(partition, offsets).drop_columns(["partition"]), file, row_group_size=4)
    versions: dict[str, int] = {}
    for partition, intervals in held.items():
        versions.update(ledger_versions(STREAM, partition, intervals))
    actions = [action for action, _ in delta_ingest.add_actions(pafs.LocalFileSystem(), str(root), name)]
    delta_ingest._commit(table, actions, versions, STREAM)


def _page(output: Path, lake_format: str, *ranges: tuple[int, int, int]) -> list[dict[str, Any]]:
    """What the Runs view reads of a run with ``ranges`` ((partition, start, end)) from the lake."""
    document = RangesDocument.parse(
        {"stream": STREAM, "ranges": [{"partition": p, "start": s, "end": e} for p, s, e in ranges]}
    )
    found = lake_records.read_record(IngestCall(str(output), lake_format, document), None)
    assert found.get("error") is None, found
    rows: list[dict[str, Any]] = found["ranges"]
    return rows


def _seen(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["rows"], row["pieces"], row["offsets_held"], row["whole"])


def test_a_delta_tables_rows_per_range_come_from_its_add_actions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "delta"
    # run a: p0 [0, 10) and p1 [0, 5); run b: p0 [10, 20) of a compacted stream (offset 12 is gone)
    _delta_run(root, "run-a", {0: [list(range(0, 10))], 1: [list(range(0, 5))]}, {0: [(0, 10)], 1: [(0, 5)]})
    _delta_run(root, "run-b", {0: [[o for o in range(10, 20) if o != 12]]}, {0: [(0, 20)]})

    wholly, partly = _page(root, "delta", (0, 0, 10), (1, 0, 8))  # two partitions: p1's range held in part
    assert _seen(wholly) == (10, 1, 10, True)
    assert _seen(partly) == (5, 1, 5, False)
    (straddled,) = _page(root, "delta", (0, 5, 15))  # both files straddle: their offset columns are read
    assert _seen(straddled) == (5 + 4, 2, 10, True)

    from deltalake import DeltaTable  # noqa: PLC0415

    metrics = DeltaTable(str(root)).optimize.compact()  # p0's two files become one; the old ones are removed
    assert (metrics["numFilesRemoved"], metrics["numFilesAdded"]) == (2, 1)
    (whole,) = _page(root, "delta", (0, 0, 20))
    assert _seen(whole) == (19, 1, 20, True)  # the removed files are not counted again
    (inside,) = _page(root, "delta", (0, 0, 10))  # the compacted file straddles the range's end
    assert _seen(inside) == (10, 1, 10, True)

    monkeypatch.setattr(bounds, "STRADDLING_FILE_READS", 0)  # no file may be read: the rows are unknown, and why
    (unread,) = _page(root, "delta", (0, 0, 10))
    assert unread["rows"] is None
    assert "reads at most 0 such files" in unread["rows_unknown"]
    assert unread["offsets_held"] == 10


def test_a_delta_file_without_stats_makes_its_ranges_rows_unknown(tmp_path: Path) -> None:
    """An add action without stats (another writer's, or stats turned off): the page says so, never guesses."""
    from deltalake.transaction import AddAction  # noqa: PLC0415

    from liftbridge_provider.spark import delta_ingest  # noqa: PLC0415

    root = tmp_path / "delta"
    _delta_run(root, "run-a", {0: [list(range(0, 10))]}, {0: [(0, 10)]})
    folder = root / "bare" / "partition=2"
    folder.mkdir(parents=True)
    pq.write_table(_rows(2, list(range(0, 5))).drop_columns(["partition"]), folder / "part-0.parquet")
    size = (folder / "part-0.parquet").stat().st_size
    action = AddAction("bare/partition=2/part-0.parquet", size, {"partition": "2"}, int(time.time() * 1000), True, "{}")
    table = delta_ingest._open(str(root))
    delta_ingest._commit(table, [action], ledger_versions(STREAM, 2, [(0, 5)]), STREAM)

    counted, unknown = _page(root, "delta", (0, 0, 10), (2, 0, 5))
    assert _seen(counted) == (10, 1, 10, True)  # a file without stats in another partition does not matter
    assert (unknown["rows"], unknown["offsets_held"]) == (None, 5)
    assert "bare/partition=2/part-0.parquet has no row count or offset bounds" in unknown["rows_unknown"]


def _iceberg_run(folder: Path, name: str, files: dict[int, list[list[int]]], held: dict[int, list[Interval]]) -> None:
    """One ingest run's commit as ``iceberg_ingest.IcebergFormat`` makes it (its embedded SQL catalog in the
    output folder, the table created by the job's own code): Parquet files with the partition column where
    Spark writes them (``<table location>/data/<name>/``), added and the partitions' intervals set as table
    properties in one Iceberg commit (``IcebergFormat.commit``)."""
    from liftbridge_provider.core.iceberg_plan import table_identifier  # noqa: PLC0415
    from liftbridge_provider.spark.iceberg_ingest import IcebergFormat, catalog_properties  # noqa: PLC0415
    from liftbridge_provider.spark.table_ingest import Written  # noqa: PLC0415

    table = IcebergFormat("liftbridge", catalog_properties(str(folder), {}), table_identifier(STREAM, None))
    table.refresh()
    location = f"{table.table.location().rstrip('/')}/data/{name}"
    Path(urlsplit(location).path).mkdir(parents=True)
    paths = []
    for partition, chunks in files.items():
        for index, offsets in enumerate(chunks):
            path = f"{location}/part-{partition}-{index:05d}.parquet"
            pq.write_table(_rows(partition, offsets), urlsplit(path).path, row_group_size=4)
            paths.append(path)
    plan = TablePlan((), (), (), {p: tuple(intervals) for p, intervals in held.items()})
    table.commit(Written(location, [], paths), plan, STREAM)


def test_an_iceberg_tables_rows_per_range_come_from_its_current_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "iceberg"
    folder.mkdir()
    _iceberg_run(folder, "run-a", {0: [list(range(0, 10))], 1: [list(range(0, 5))]}, {0: [(0, 10)], 1: [(0, 5)]})
    _iceberg_run(folder, "run-b", {0: [[o for o in range(10, 20) if o != 12]]}, {0: [(0, 20)]})

    wholly, partly = _page(folder, "iceberg", (0, 0, 10), (1, 0, 8))
    assert _seen(wholly) == (10, 1, 10, True)
    assert _seen(partly) == (5, 1, 5, False)
    (straddled,) = _page(folder, "iceberg", (0, 5, 15))
    assert _seen(straddled) == (5 + 4, 2, 10, True)

    from pyiceberg.catalog.sql import SqlCatalog  # noqa: PLC0415

    catalog = SqlCatalog("liftbridge", uri=f"sqlite:///{folder}/catalog.db", warehouse=f"file://{folder}")
    table = catalog.load_table("liftbridge.orders_eu_1")
    # a compaction of p0: its two files replaced by one (the table's properties, its held offsets, stay)
    table.overwrite(_rows(0, [o for o in range(0, 20) if o != 12]), overwrite_filter="partition = 0")
    assert len([task for task in catalog.load_table("liftbridge.orders_eu_1").scan().plan_files()]) == 2
    (whole,) = _page(folder, "iceberg", (0, 0, 20))
    assert _seen(whole) == (19, 1, 20, True)  # the replaced files are not counted again
    (inside,) = _page(folder, "iceberg", (0, 0, 10))
    assert _seen(inside) == (10, 1, 10, True)

    monkeypatch.setattr(bounds, "STRADDLING_FILE_READS", 0)
    (unread,) = _page(folder, "iceberg", (0, 0, 10))
    assert (unread["rows"], unread["offsets_held"]) == (None, 10)
    assert "reads at most 0 such files" in unread["rows_unknown"]


def test_the_page_opens_the_jobs_iceberg_catalog_by_the_jobs_names_and_never_creates_one(tmp_path: Path) -> None:
    """An embedded SQL catalog keys its tables by the catalog's name: the page must open it under the run's
    ``--iceberg-catalog`` (default ``liftbridge``, as the job), or it finds no table. A folder without a
    catalog is refused, not given a new empty ``catalog.db`` (the page is read-only)."""
    from liftbridge_provider.ui.runs import ingest_call  # noqa: PLC0415

    args = ["--ranges", '{"stream": "s", "ranges": []}', "--output", "/l", "--format", "iceberg"]
    call = ingest_call({"application_args": args})
    assert call is not None
    assert (call.iceberg_catalog, call.iceberg_table, call.iceberg_catalog_given) == ("liftbridge", None, False)
    more = ["--iceberg-catalog", "mine", "--iceberg-table", "ns.t", "--iceberg-catalog-property", "type=rest"]
    call = ingest_call({"application_args": args + more})
    assert call is not None
    assert (call.iceberg_catalog, call.iceberg_table, call.iceberg_catalog_given) == ("mine", "ns.t", True)

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no Iceberg catalog"):
        _page(empty, "iceberg", (0, 0, 10))
    assert list(empty.iterdir()) == []
