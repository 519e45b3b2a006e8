"""Ingest frozen offset ranges into a Delta table, every offset exactly once (``ingest.py --format delta``).

Spark reads the pieces the table does not hold yet (liftbridge_provider/delta_plan.py)
and writes them as Parquet files inside the table's folder (the table is
partitioned by ``partition``); delta-rs then
commits those files and each partition's next offset (a Delta application
transaction, ``liftbridge:<stream>:<partition>``) in one Delta transaction.
A run killed before that commit leaves only files no Delta reader sees
(``DeltaTable.vacuum`` removes them); two runs at once cannot both commit the
same offsets (Delta refuses the second commit as a concurrent transaction), and
the loser plans again from the table and finds them held. Delta jars for Spark
4.3 do not exist yet, so the commit is delta-rs's; any Delta reader (delta-rs,
DuckDB, Polars, Spark with Delta) reads the table.

The table is a local path (a plain path or a ``file:`` URI).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, Schema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction
from pyspark.sql import DataFrame, SparkSession

from liftbridge_provider import fault_points
from liftbridge_provider.client.errors import InvalidArgumentError
from liftbridge_provider.delta_plan import TXN_RETENTION_PROPERTY, DeltaPlan, plan_delta
from liftbridge_provider.delta_table import PARTITION_COLUMN, holdings, table_path
from liftbridge_provider.lake import LakeError, Outcome, problems
from liftbridge_provider.ranges import OffsetRange, RangesDocument
from liftbridge_provider.spark.pieces import read_pieces
from liftbridge_provider.spark.source import arrow_schema

log = logging.getLogger("liftbridge.ingest.delta")

COMMIT_ATTEMPTS = 5  # plans in a row that lost their commit to another run before the job gives up
STATS_COLUMNS = ("offset",)  # min/max kept in each file's Delta stats (for data skipping)


class _MicrosTimestamps:
    """Spark writes INT96 timestamps by default; Delta's timestamp is microseconds. Sets the session's
    output type while any Delta write of this process runs (writes may overlap: the first sets it, the
    last restores it)."""

    KEY = "spark.sql.parquet.outputTimestampType"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writes = 0
        self._before: str | None = None

    @contextmanager
    def __call__(self, spark: SparkSession) -> Iterator[None]:
        with self._lock:
            if self._writes == 0:
                self._before = spark.conf.get(self.KEY, None)
                spark.conf.set(self.KEY, "TIMESTAMP_MICROS")
            self._writes += 1
        try:
            yield
        finally:
            with self._lock:
                self._writes -= 1
                if self._writes == 0:
                    if self._before is None:
                        spark.conf.unset(self.KEY)
                    else:
                        spark.conf.set(self.KEY, self._before)


_micros_timestamps = _MicrosTimestamps()


def _open(table: str) -> DeltaTable:
    """The table, created empty first when missing.

    Never created together with the first files: delta-rs lets two crossing creates both succeed (the
    second becomes version 1 with its files: 25 of 40 tries, measured), which would double the rows;
    an append is checked against the snapshot it read (a crossing commit of the same app ids fails).
    """
    try:
        DeltaTable.create(table, Schema.from_arrow(arrow_schema()), mode="ignore", partition_by=[PARTITION_COLUMN])
    except DeltaError as exc:  # another run created it at this moment
        log.info("creating the Delta table %s: %s", table, exc)
    delta = DeltaTable(table)
    _check_shape(delta, table)
    return delta


def check_table(table: str) -> None:
    """InvalidArgumentError when the Delta table at ``table`` exists with other columns or partitioning than
    this job writes (a missing table is fine: it is created)."""
    try:
        delta = DeltaTable(table)
    except TableNotFoundError:
        return
    _check_shape(delta, table)


def _check_shape(delta: DeltaTable, table: str) -> None:
    expiry = delta.metadata().configuration.get(TXN_RETENTION_PROPERTY)
    if expiry is not None:
        raise InvalidArgumentError(
            f"the Delta table {table} sets {TXN_RETENTION_PROPERTY}={expiry}: Delta then drops the application "
            "transactions that record which offsets the table holds, and a rerun would write them again; "
            f"unset it (ALTER TABLE ... UNSET TBLPROPERTIES ('{TXN_RETENTION_PROPERTY}')) or use another table"
        )
    expected = Schema.from_arrow(arrow_schema())
    partitioning = list(delta.metadata().partition_columns)
    if delta.schema() == expected and partitioning == [PARTITION_COLUMN]:
        return
    raise InvalidArgumentError(
        f"the Delta table {table} has columns ({_columns(delta.schema())}) partitioned by {partitioning}; "
        f"this job writes ({_columns(expected)}) partitioned by {[PARTITION_COLUMN]}: "
        "use a new table or one this job wrote"
    )


def _columns(schema: Schema) -> str:
    return ", ".join(f"{f.name} {getattr(f.type, 'type', f.type)}" for f in schema.fields)


def _stats(path: Path) -> str:
    """Delta file stats from the Parquet footer: row count, min/max offset (left out unless every row group
    with rows has them: partial bounds would mislead data skipping and the piece checks)."""
    metadata = pq.ParquetFile(path).metadata
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    names = [metadata.schema.column(i).name for i in range(metadata.num_columns)]
    for name in STATS_COLUMNS:
        groups = [metadata.row_group(g) for g in range(metadata.num_row_groups)]
        stats = [g.column(names.index(name)).statistics for g in groups if g.num_rows]
        if stats and all(s is not None and s.has_min_max for s in stats):
            low[name] = min(s.min for s in stats)
            high[name] = max(s.max for s in stats)
    return json.dumps({"numRecords": metadata.num_rows, "minValues": low, "maxValues": high})


def add_actions(table: str, folder: Path) -> list[AddAction]:
    """One Delta add action per Parquet file Spark wrote in ``folder``'s ``partition=N`` folders (paths
    relative to the table)."""
    actions = []
    for path in sorted(folder.glob(f"{PARTITION_COLUMN}=*/*.parquet")):
        info = path.stat()
        relative = path.relative_to(table).as_posix()
        partition = {PARTITION_COLUMN: path.parent.name.split("=", 1)[1]}
        actions.append(AddAction(relative, info.st_size, partition, int(info.st_mtime * 1000), True, _stats(path)))
    return actions


def _entries(actions: list[AddAction], folder: Path, plan: DeltaPlan, run: str) -> list[dict[str, Any]]:
    """What the written files hold per piece (rows, min and max offset), as the lake checks expect, from the
    files' Parquet footers (the add actions' stats): no second Spark job.

    A Spark task reads one slice of one piece, so each file's rows belong to one piece: the one its lowest
    offset falls in (the checks then flag any offset outside it).
    """
    found: dict[OffsetRange, dict[str, Any]] = {}
    for action in actions:
        stats = json.loads(action.stats)
        if not stats["numRecords"]:
            continue
        partition = int(str(action.partition_values[PARTITION_COLUMN]))
        low, high = _offset_bounds(stats, folder.parent / action.path)  # paths are relative to the table
        piece = _piece_of(plan.write, partition, low)
        seen = found.setdefault(piece, {"rows": 0, "min": low, "max": high})
        seen["rows"] += stats["numRecords"]
        seen["min"], seen["max"] = min(seen["min"], low), max(seen["max"], high)
    entries = []
    for piece in plan.write:
        row = found.pop(piece, None)
        entries.append(_entry(piece, row, folder, run))
    entries += [_entry(piece, row, folder, run) for piece, row in found.items()]  # rows of no planned piece
    return entries


def _piece_of(pieces: tuple[OffsetRange, ...], partition: int, offset: int) -> OffsetRange:
    """The planned piece of ``partition`` that ``offset`` falls in (else the nearest below it, else the first
    of the partition, else an empty piece of the partition: the checks report the rows as outside)."""
    own = [p for p in pieces if p.partition == partition]
    below = [p for p in own if p.start <= offset]
    if below:
        return max(below)
    return own[0] if own else OffsetRange(partition, 0, 0)


def _entry(piece: OffsetRange, row: Mapping[str, Any] | None, folder: Path, run: str) -> dict[str, Any]:
    return {
        "partition": piece.partition,
        "start": piece.start,
        "end": piece.end,
        "rows": row["rows"] if row else 0,
        "min_offset": row["min"] if row else None,
        "max_offset": row["max"] if row else None,
        "path": str(folder),
        "run": run,
    }


def _offset_bounds(stats: Mapping[str, Any], path: Path) -> tuple[int, int]:
    """The lowest and highest offset in a file with rows: from its footer, else read from the file."""
    low, high = stats["minValues"].get("offset"), stats["maxValues"].get("offset")
    if low is None or high is None:  # a writer that kept no statistics
        offsets = pq.read_table(path, columns=["offset"]).column("offset")
        low, high = pc.min(offsets).as_py(), pc.max(offsets).as_py()
    return int(low), int(high)


def _commit(table: DeltaTable, actions: list[AddAction], versions: Mapping[str, int], stream: str) -> None:
    """One Delta transaction: the files and the new ``{app id: version}`` (CommitFailedError when another
    writer moved one of those app ids since ``table`` was read)."""
    now = int(time.time() * 1000)
    transactions = [Transaction(app, version, now) for app, version in sorted(versions.items())]
    properties = CommitProperties(
        app_transactions=transactions, custom_metadata={"liftbridge.stream": stream}, max_commit_retries=3
    )
    changes: list[AddAction | RemoveAction] = [*actions]
    schema = Schema.from_arrow(arrow_schema())
    table.create_write_transaction(changes, "append", schema, [PARTITION_COLUMN], commit_properties=properties)


def _write_files(spark: SparkSession, frame: DataFrame, folder: Path) -> None:
    """Parquet files for Delta (microsecond timestamps), one folder per partition."""
    with _micros_timestamps(spark):
        frame.write.partitionBy(PARTITION_COLUMN).mode("errorifexists").parquet(folder.as_uri())


def _holdings(table: DeltaTable, document: RangesDocument) -> dict[int, list[tuple[int, int]]]:
    return holdings(table, document.stream, [r.partition for r in document.ranges if r.count])


def _gaps(plan: DeltaPlan) -> list[str]:
    return [f"partition {g.partition}: the lake misses offsets [{g.start}, {g.end})" for g in plan.gaps]


def _describe(pieces: tuple[OffsetRange, ...]) -> str:
    return ", ".join(f"{r.partition}:[{r.start}, {r.end})" for r in pieces) or "nothing"


def ingest_delta(
    spark: SparkSession,
    document: RangesDocument,
    options: Mapping[str, str],
    table: str,
    *,
    run: str,
    compacted: bool,
    head_loss_ok: bool,
) -> Outcome:
    """Write what the Delta table at ``table`` (a local folder) lacks of ``document``'s ranges, exactly once.

    Raises LakeError when other runs won every commit attempt, or when the table does not hold every range
    after this run committed (a range the job cannot land is never a success).
    """
    for attempt in range(COMMIT_ATTEMPTS):
        delta = _open(table)
        plan = plan_delta(document, _holdings(delta, document))
        gaps = _gaps(plan)
        if plan.done:
            log.info("Delta table %s holds %s already", table, _describe(plan.held))
            return Outcome([], [], gaps, f"{table} (Delta version {delta.version()})")
        log.info("Delta table %s holds %s; writing %s", table, _describe(plan.held), _describe(plan.write))
        folder = Path(table) / f"liftbridge-{run}-{attempt}"
        _write_files(spark, read_pieces(spark, document.stream, plan.write, options), folder)
        actions = add_actions(table, folder)
        entries = _entries(actions, folder, plan, run)
        found = problems(entries, compacted, head_loss_ok)
        if found:
            shutil.rmtree(folder, ignore_errors=True)
            return Outcome(entries, [f"{p} (not committed)" for p in found], gaps, table)
        fault_points.reached("ingest.delta_written")
        try:
            _commit(delta, actions, plan.versions(document.stream), document.stream)
        except CommitFailedError as exc:
            log.info("attempt %d: another run committed first (%s); planning again", attempt + 1, exc)
            shutil.rmtree(folder, ignore_errors=True)
            continue
        committed = DeltaTable(table)
        version = committed.version()
        log.info("committed %d rows as Delta version %d of %s", sum(e["rows"] for e in entries), version, table)
        left = plan_delta(document, _holdings(committed, document))
        if not left.done:
            raise LakeError(f"after commit {version}, {table} still lacks {_describe(left.write)}")
        return Outcome(entries, [], _gaps(left), f"{table} (Delta version {version})")
    raise LakeError(f"other runs committed to {table} before each of {COMMIT_ATTEMPTS} attempts; run again")


class DeltaBatchWriter:
    """A ``foreachBatch`` function that lands each micro-batch of a ``liftbridge`` stream query in a Delta
    table exactly once: the batch's files and the batch id (a Delta application transaction,
    ``liftbridge-query:<query_name>``, as Delta's own ``txnAppId``/``txnVersion``) commit together, and a
    batch Spark replays after a crash (its id at or below the committed one) is skipped.

    :param table: the Delta table, a local path (created when missing, partitioned by ``partition``).
    :param query_name: names the query's progress in the table; one per checkpoint (a new checkpoint
        restarts batch ids at 0: give it a new name).
    """

    def __init__(self, table: str, query_name: str) -> None:
        if not query_name or not isinstance(query_name, str):
            raise InvalidArgumentError(f"query_name must be a non-empty string, got {query_name!r}")
        self.table = table_path(table)
        self.app_id = f"liftbridge-query:{query_name}"

    def committed_batch(self) -> int | None:
        """The last micro-batch id the table holds for this query (None: none yet)."""
        return _open(self.table).transaction_version(self.app_id)

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        delta = _open(self.table)
        done = delta.transaction_version(self.app_id)
        if done is not None and batch_id <= done:
            log.info(
                "micro-batch %d of %s is in %s already (up to %d): skipped", batch_id, self.app_id, self.table, done
            )
            return
        folder = Path(self.table) / f"liftbridge-batch-{batch_id}-{uuid.uuid4().hex[:12]}"
        _write_files(frame.sparkSession, frame, folder)
        fault_points.reached("delta.batch_written")
        try:
            _commit(delta, add_actions(self.table, folder), {self.app_id: batch_id}, self.app_id)
        except CommitFailedError:
            shutil.rmtree(folder, ignore_errors=True)
            committed = self.committed_batch()
            if committed is None or committed < batch_id:
                raise
            log.info("micro-batch %d of %s was committed by another writer: skipped", batch_id, self.app_id)
