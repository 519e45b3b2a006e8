"""Ingest frozen offset ranges into a table format that records the offsets it holds (Delta, Iceberg).

The loop every such format shares (``--format delta``, ``--format iceberg``):

1. load the table (created when missing) and read the offset intervals it
   holds of each partition (the format's own record: Delta application
   transactions, Iceberg table properties);
2. plan (``table_plan.plan_table``, pure): what each range lacks;
3. Spark reads every missing piece in one job (``pieces.read_pieces``) and
   writes Parquet files where the table keeps its data;
4. check the rows per piece from the files' footers (no second Spark job):
   a shortfall fails unless ``--compacted``, an offset outside its piece
   always fails; a failed check commits nothing;
5. commit the files and the partitions' new intervals in one table commit,
   which fails when another writer committed first (then plan again, up to
   :data:`COMMIT_ATTEMPTS` times);
6. read the intervals back: the table must hold every range now, or the run
   fails (a range the job cannot land is never a success).

A run killed between 3 and 5 leaves files no reader of the table sees. The fault points
``ingest.table_planned`` (after 2), ``ingest.table_written`` (after 4) and ``ingest.table_committed`` (after 5)
let tests kill a run at each step.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from liftbridge_provider import fault_points
from liftbridge_provider.core.lake import LakeError, Outcome, problems
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.core.table_plan import Interval, TablePlan, plan_table
from liftbridge_provider.spark.pieces import read_pieces
from liftbridge_provider.spark.session_settings import micros_timestamps

log = logging.getLogger("liftbridge.ingest.table")

COMMIT_ATTEMPTS = 5  # plans in a row that lost their commit to another run before the job gives up


class CommitConflict(Exception):
    """Another writer committed to the table since this run read it: nothing of this commit landed."""


@dataclass(frozen=True)
class FileStats:
    """One written Parquet file: its partition, rows, and smallest and largest offset (None: no rows)."""

    path: str
    partition: int | None
    rows: int
    low: int | None
    high: int | None


@dataclass
class Written:
    """The files one run wrote for a table (``handle``: whatever the format needs to commit them)."""

    location: str
    files: list[FileStats]
    handle: Any = field(default=None)


class TableFormat(Protocol):
    """A table that records the offsets it holds and commits files and that record at once."""

    def refresh(self) -> None:
        """Load the table as it is now (creating it empty when missing); InvalidArgumentError if unusable."""

    def holdings(self, stream: str, partitions: Sequence[int]) -> Mapping[int, Sequence[Interval]]:
        """The intervals the loaded table holds of each partition (LakeError: not a valid record)."""

    def write(self, spark: SparkSession, frame: DataFrame, name: str) -> Written:
        """Have Spark write ``frame`` as Parquet files where the table keeps data (a new folder ``name``)."""

    def commit(self, written: Written, plan: TablePlan, stream: str) -> None:
        """Commit the files and ``plan``'s new intervals at once; CommitConflict when another writer won."""

    def discard(self, written: Written) -> None:
        """Remove files that will not be committed."""

    def describe(self) -> str:
        """The table and its version, for logs and the outcome."""


def footer_stats(path: str, source: str | IO[bytes], partition: int | None = None) -> FileStats:
    """A file's rows and offset bounds from its Parquet footer (read from the file when a row group keeps
    no offset statistics); ``partition``: the file's own when not given (every row of a Spark task's file
    has one partition, so its footer's min and max agree)."""
    parquet = pq.ParquetFile(source)
    metadata = parquet.metadata
    names = [metadata.schema.column(i).name for i in range(metadata.num_columns)]
    groups = [metadata.row_group(g) for g in range(metadata.num_row_groups) if metadata.row_group(g).num_rows]
    if not groups:
        return FileStats(path, partition, 0, None, None)

    def bounds(column: str) -> tuple[int, int] | None:
        stats = [g.column(names.index(column)).statistics for g in groups] if column in names else []
        if stats and all(s is not None and s.has_min_max for s in stats):
            return int(min(s.min for s in stats)), int(max(s.max for s in stats))
        if column not in names:
            return None
        values = parquet.read(columns=[column]).column(column)
        return int(pc.min(values).as_py()), int(pc.max(values).as_py())

    offsets = bounds("offset")
    assert offsets is not None, f"{path} has no offset column"
    if partition is None:
        found = bounds("partition")
        if found is not None and found[0] == found[1]:
            partition = found[0]
    return FileStats(path, partition, metadata.num_rows, offsets[0], offsets[1])


def entries_of(written: Written, plan: TablePlan, run: str) -> list[dict[str, Any]]:
    """What the written files hold per piece (rows, min and max offset), as the lake checks expect.

    A Spark task reads one slice of one piece, so each file's rows belong to one piece: the one its lowest
    offset falls in (the checks then flag any offset outside it).
    """
    found: dict[OffsetRange, dict[str, Any]] = {}
    for stats in written.files:
        if not stats.rows or stats.low is None or stats.high is None:
            continue
        piece = _piece_of(plan.write, -1 if stats.partition is None else stats.partition, stats.low)
        seen = found.setdefault(piece, {"rows": 0, "min": stats.low, "max": stats.high})
        seen["rows"] += stats.rows
        seen["min"], seen["max"] = min(seen["min"], stats.low), max(seen["max"], stats.high)
    entries = [_entry(piece, found.pop(piece, None), written.location, run) for piece in plan.write]
    return entries + [_entry(p, row, written.location, run) for p, row in found.items()]  # of no planned piece


def _piece_of(pieces: tuple[OffsetRange, ...], partition: int, offset: int) -> OffsetRange:
    """The planned piece of ``partition`` that ``offset`` falls in (else the nearest below it, else the first
    of the partition, else an empty piece of the partition: the checks report the rows as outside)."""
    own = [p for p in pieces if p.partition == partition]
    below = [p for p in own if p.start <= offset]
    if below:
        return max(below)
    return own[0] if own else OffsetRange(max(partition, 0), 0, 0)


def _entry(piece: OffsetRange, row: Mapping[str, Any] | None, location: str, run: str) -> dict[str, Any]:
    return {
        "partition": piece.partition,
        "start": piece.start,
        "end": piece.end,
        "rows": row["rows"] if row else 0,
        "min_offset": row["min"] if row else None,
        "max_offset": row["max"] if row else None,
        "path": location,
        "run": run,
    }


def _gaps(plan: TablePlan) -> list[str]:
    return [f"partition {g.partition}: the lake misses offsets [{g.start}, {g.end})" for g in plan.gaps]


def _describe(pieces: tuple[OffsetRange, ...]) -> str:
    return ", ".join(f"{r.partition}:[{r.start}, {r.end})" for r in pieces) or "nothing"


def held_outcome(table: TableFormat, document: RangesDocument) -> Outcome | None:
    """The outcome of a run that finds every range of ``document`` in the loaded ``table`` (as
    :func:`ingest_table` reports it), or None when the table lacks part of one."""
    plan = plan_table(document, table.holdings(document.stream, [r.partition for r in document.ranges if r.count]))
    if not plan.done:
        return None
    log.info("%s holds %s already", table.describe(), _describe(plan.held))
    return Outcome([], [], _gaps(plan), table.describe())


def ingest_table(
    spark: SparkSession,
    document: RangesDocument,
    options: Mapping[str, str],
    table: TableFormat,
    *,
    run: str,
    compacted: bool,
    head_loss_ok: bool,
) -> Outcome:
    """Write what ``table`` lacks of ``document``'s ranges, exactly once (see the module docstring).

    Raises LakeError when other runs won every commit attempt, or when the table does not hold every range
    after this run committed.
    """
    partitions = [r.partition for r in document.ranges if r.count]
    for attempt in range(COMMIT_ATTEMPTS):
        table.refresh()
        plan = plan_table(document, table.holdings(document.stream, partitions))
        if plan.done:
            log.info("%s holds %s already", table.describe(), _describe(plan.held))
            return Outcome([], [], _gaps(plan), table.describe())
        log.info("%s holds %s; writing %s", table.describe(), _describe(plan.held), _describe(plan.write))
        fault_points.reached("ingest.table_planned")
        frame = read_pieces(spark, document.stream, plan.write, options)
        with micros_timestamps(spark):
            written = table.write(spark, frame, f"liftbridge-{run}-{attempt}")
        entries = entries_of(written, plan, run)
        found = problems(entries, compacted, head_loss_ok)
        if found:
            table.discard(written)
            return Outcome(entries, [f"{p} (not committed)" for p in found], _gaps(plan), table.describe())
        fault_points.reached("ingest.table_written")
        try:
            table.commit(written, plan, document.stream)
        except CommitConflict as exc:
            log.info("attempt %d: another run committed first (%s); planning again", attempt + 1, exc)
            table.discard(written)
            continue
        fault_points.reached("ingest.table_committed")
        table.refresh()
        log.info("committed %d rows: %s", sum(e["rows"] for e in entries), table.describe())
        left = plan_table(document, table.holdings(document.stream, partitions))
        if not left.done:
            raise LakeError(f"after its commit, {table.describe()} still lacks {_describe(left.write)}")
        return Outcome(entries, [], _gaps(left), table.describe())
    raise LakeError(f"other runs committed to {table.describe()} before each of {COMMIT_ATTEMPTS} attempts")
