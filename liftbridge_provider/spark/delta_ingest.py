"""Delta tables for the ingest job (``ingest.py --format delta``) and for stream queries (``DeltaBatchWriter``).

:class:`DeltaFormat` is the Delta side of ``spark/table_ingest.py``'s loop:
the table's transaction log records the offset intervals it holds as Delta
application transactions (``core/delta_plan.py``), Spark writes the missing pieces
as Parquet files inside the table's folder (partitioned by ``partition``),
and delta-rs commits those files and the partitions' new intervals in one
Delta transaction. Delta refuses a commit when a concurrent one wrote an
app id it writes too (every commit to a partition writes its ``pieces`` id),
so the loser plans again. A run killed before the commit leaves only files
no Delta reader sees (``DeltaTable.vacuum`` removes them). Delta jars for
Spark 4.3 do not exist yet, so the commit is delta-rs's; any Delta reader
(delta-rs, DuckDB, Polars, Spark with Delta) reads the table.

The table is a local path (a plain path or a ``file:`` URI).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from deltalake import DeltaTable, Schema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction
from pyspark.sql import DataFrame, SparkSession

from liftbridge_provider import fault_points
from liftbridge_provider.core.delta_plan import TXN_RETENTION_PROPERTY, plan_versions
from liftbridge_provider.core.errors import InvalidArgumentError
from liftbridge_provider.core.table_plan import Interval, TablePlan
from liftbridge_provider.delta_table import PARTITION_COLUMN, holdings, table_path
from liftbridge_provider.spark.reader import arrow_schema
from liftbridge_provider.spark.session_settings import micros_timestamps, unsorted_partitioned_writes
from liftbridge_provider.spark.table_ingest import CommitConflict, Written, footer_stats

log = logging.getLogger("liftbridge.ingest.delta")

STATS_COLUMNS = ("offset",)  # min/max kept in each file's Delta stats (for data skipping)


def _open(table: str) -> DeltaTable:
    """The table, created empty first when missing.

    Never created together with the first files: delta-rs lets two crossing creates both succeed (the
    second becomes version 1 with its files), which would double the rows;
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
    with micros_timestamps(spark), unsorted_partitioned_writes(spark):
        frame.write.partitionBy(PARTITION_COLUMN).mode("errorifexists").parquet(folder.as_uri())


class DeltaFormat:
    """A Delta table at a local path, as ``table_ingest.ingest_table`` drives it."""

    def __init__(self, table: str) -> None:
        self.path = table
        self._delta: DeltaTable | None = None

    @property
    def delta(self) -> DeltaTable:
        assert self._delta is not None, "refresh() first"
        return self._delta

    def refresh(self) -> None:
        self._delta = _open(self.path)

    def holdings(self, stream: str, partitions: Sequence[int]) -> dict[int, list[Interval]]:
        return holdings(self.delta, stream, partitions)

    def write(self, spark: SparkSession, frame: DataFrame, name: str) -> Written:
        folder = Path(self.path) / name
        with unsorted_partitioned_writes(spark):
            frame.write.partitionBy(PARTITION_COLUMN).mode("errorifexists").parquet(folder.as_uri())
        actions = add_actions(self.path, folder)
        files = [
            footer_stats(a.path, str(Path(self.path) / a.path), int(str(a.partition_values[PARTITION_COLUMN])))
            for a in actions
        ]
        return Written(str(folder), files, actions)

    def commit(self, written: Written, plan: TablePlan, stream: str) -> None:
        try:
            _commit(self.delta, written.handle, plan_versions(stream, plan), stream)
        except CommitFailedError as exc:
            raise CommitConflict(str(exc)) from exc

    def discard(self, written: Written) -> None:
        shutil.rmtree(written.location, ignore_errors=True)

    def describe(self) -> str:
        return f"{self.path} (Delta version {self.delta.version()})" if self._delta else self.path


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
