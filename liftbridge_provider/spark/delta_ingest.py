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

The table is a local path (a plain path or a ``file:`` URI) or an S3 location (``s3a://bucket/key``): Spark
writes the files through S3A, delta-rs reads and commits with ``storage_options`` and pyarrow lists the files
and reads their footers, all three from one
:class:`~liftbridge_provider.core.object_store.S3Settings` (``spark/s3_session.py``). On S3, delta-rs writes
each commit ``_delta_log/<version>.json`` with a conditional PUT (``If-None-Match: *``,
``AWS_CONDITIONAL_PUT=etag``), so of two commits of one version the store keeps the first and refuses the
second (HTTP 412): the loser reads the new version and Delta's conflict check refuses it as above. No lock
service (DynamoDB) is needed; the store must honour ``If-None-Match`` (AWS S3 does since 2024-08).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable, Schema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction
from pyspark.sql import DataFrame, SparkSession

from liftbridge_provider import fault_points
from liftbridge_provider.core.delta_plan import TXN_RETENTION_PROPERTY, plan_versions
from liftbridge_provider.core.errors import InvalidArgumentError
from liftbridge_provider.core.object_store import S3Settings
from liftbridge_provider.core.s3_sources import s3_location, spark_uri
from liftbridge_provider.core.table_plan import Interval, TablePlan
from liftbridge_provider.delta_table import PARTITION_COLUMN, holdings, table_path
from liftbridge_provider.spark.reader import arrow_schema
from liftbridge_provider.spark.s3_session import session_s3_settings
from liftbridge_provider.spark.session_settings import micros_timestamps, unsorted_partitioned_writes
from liftbridge_provider.spark.table_ingest import CommitConflict, FileStats, Written, footer_stats

log = logging.getLogger("liftbridge.ingest.delta")

STATS_COLUMNS = ("offset",)  # min/max kept in each file's Delta stats (for data skipping)


def _open(table: str, storage_options: Mapping[str, str] | None = None) -> DeltaTable:
    """The table, created empty first when missing.

    Never created together with the first files: delta-rs lets two crossing creates both succeed (the
    second becomes version 1 with its files), which would double the rows;
    an append is checked against the snapshot it read (a crossing commit of the same app ids fails).
    """
    options = dict(storage_options or {}) or None
    try:
        DeltaTable.create(
            table,
            Schema.from_arrow(arrow_schema()),
            mode="ignore",
            partition_by=[PARTITION_COLUMN],
            storage_options=options,
        )
    except DeltaError as exc:  # another run created it at this moment
        log.info("creating the Delta table %s: %s", table, exc)
    delta = DeltaTable(table, storage_options=options)
    _check_shape(delta, table)
    return delta


def check_table(table: str, storage_options: Mapping[str, str] | None = None) -> None:
    """InvalidArgumentError when the Delta table at ``table`` exists with other columns or partitioning than
    this job writes (a missing table is fine: it is created)."""
    try:
        delta = DeltaTable(table, storage_options=dict(storage_options or {}) or None)
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


def _stats(source: IO[bytes]) -> str:
    """Delta file stats from the Parquet footer: row count, min/max offset (left out unless every row group
    with rows has them: partial bounds would mislead data skipping and the piece checks)."""
    metadata = pq.ParquetFile(source).metadata
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


def files_of(table: str, settings: S3Settings | None) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem that holds ``table`` (delta-rs's name of it) and the table's path on it: the
    local filesystem and the folder, or S3 (``settings``) and ``bucket/key``."""
    location = s3_location(table)
    if location is None:
        return pafs.LocalFileSystem(), table
    if settings is None:
        raise InvalidArgumentError(f"the Delta table {table} is on S3, and no S3 settings were given for it")
    bucket, key = location
    return pafs.S3FileSystem(**settings.pyarrow_options()), f"{bucket}/{key}".rstrip("/")


def add_actions(fs: pafs.FileSystem, root: str, name: str) -> list[tuple[AddAction, FileStats]]:
    """One Delta add action per Parquet file Spark wrote in folder ``name``'s ``partition=N`` folders of the
    table at ``root`` on ``fs`` (paths relative to the table), with the file's rows and offset bounds; each
    footer is read once."""
    found = []
    selector = pafs.FileSelector(f"{root}/{name}", allow_not_found=True, recursive=True)
    for info in sorted(fs.get_file_info(selector), key=lambda i: i.path):
        relative = info.path[len(root) + 1 :]
        folder = relative.rsplit("/", 2)[-2] if relative.count("/") >= 2 else ""
        if not info.is_file or not info.base_name.endswith(".parquet") or not folder.startswith(f"{PARTITION_COLUMN}="):
            continue
        partition = folder.split("=", 1)[1]
        with fs.open_input_file(info.path) as source:
            stats = _stats(source)
            file_stats = footer_stats(relative, source, int(partition))
        mtime = int(info.mtime.timestamp() * 1000) if info.mtime is not None else int(time.time() * 1000)
        action = AddAction(relative, info.size or 0, {PARTITION_COLUMN: partition}, mtime, True, stats)
        found.append((action, file_stats))
    return found


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


def _writer_uri(table: str, name: str) -> str:
    """The URI Spark writes folder ``name`` of ``table`` to (``s3a://`` for S3A, ``file:`` for a local table)."""
    if s3_location(table) is not None:
        return spark_uri(f"{table}/{name}")
    return (Path(table) / name).as_uri()


class DeltaFormat:
    """A Delta table, local or on S3, as ``table_ingest.ingest_table`` drives it.

    :param table: where the table is, as :func:`~liftbridge_provider.delta_table.table_path` names it.
    :param settings: the S3 settings of a table on S3 (delta-rs's storage options and pyarrow's filesystem
        come from them); None for a local table.
    """

    def __init__(self, table: str, settings: S3Settings | None = None) -> None:
        self.path = table
        self.settings = settings
        self.storage_options = settings.delta_storage_options() if settings is not None else None
        self._delta: DeltaTable | None = None
        self._files: tuple[pafs.FileSystem, str] | None = None

    @property
    def files(self) -> tuple[pafs.FileSystem, str]:
        """The filesystem Spark's files are listed and read on, and the table's path there."""
        if self._files is None:
            self._files = files_of(self.path, self.settings)
        return self._files

    @property
    def delta(self) -> DeltaTable:
        assert self._delta is not None, "refresh() first"
        return self._delta

    def check(self) -> None:
        """Before anything is written: an existing table has the shape and settings this job needs."""
        check_table(self.path, self.storage_options)

    def refresh(self) -> None:
        self._delta = _open(self.path, self.storage_options)

    def load(self) -> bool:
        """Load the table as it is, without creating it: False when there is none (``spark/landed.py``)."""
        try:
            self._delta = DeltaTable(self.path, storage_options=dict(self.storage_options or {}) or None)
        except TableNotFoundError:
            return False
        _check_shape(self._delta, self.path)
        return True

    def holdings(self, stream: str, partitions: Sequence[int]) -> dict[int, list[Interval]]:
        return holdings(self.delta, stream, partitions)

    def write(self, spark: SparkSession, frame: DataFrame, name: str) -> Written:
        with unsorted_partitioned_writes(spark):
            frame.write.partitionBy(PARTITION_COLUMN).mode("errorifexists").parquet(_writer_uri(self.path, name))
        added = add_actions(*self.files, name)
        return Written(f"{self.path}/{name}", [stats for _, stats in added], [action for action, _ in added])

    def commit(self, written: Written, plan: TablePlan, stream: str) -> None:
        try:
            _commit(self.delta, written.handle, plan_versions(stream, plan), stream)
        except CommitFailedError as exc:
            raise CommitConflict(str(exc)) from exc

    def discard(self, written: Written) -> None:
        files, root = self.files
        try:
            files.delete_dir(f"{root}/{written.location.rsplit('/', 1)[-1]}")
        except OSError as exc:  # files no Delta reader sees; DeltaTable.vacuum removes them later
            log.warning("could not delete %s: %s", written.location, exc)

    def describe(self) -> str:
        return f"{self.path} (Delta version {self.delta.version()})" if self._delta else self.path


class DeltaBatchWriter:
    """A ``foreachBatch`` function that lands each micro-batch of a ``liftbridge`` stream query in a Delta
    table exactly once: the batch's files and the batch id (a Delta application transaction,
    ``liftbridge-query:<query_name>``, as Delta's own ``txnAppId``/``txnVersion``) commit together, and a
    batch Spark replays after a crash (its id at or below the committed one) is skipped.

    :param table: the Delta table, a local path or an S3 location (``s3a://bucket/key``), created when
        missing, partitioned by ``partition``.
    :param query_name: names the query's progress in the table; one per checkpoint (a new checkpoint
        restarts batch ids at 0: give it a new name).
    :param settings: the S3 settings of a table on S3; default None: the S3A settings of the micro-batch's
        Spark session for the table's bucket (the one source the ingest job uses, ``spark/s3_session.py``),
        read at the first batch.
    """

    def __init__(self, table: str, query_name: str, *, settings: S3Settings | None = None) -> None:
        if not query_name or not isinstance(query_name, str):
            raise InvalidArgumentError(f"query_name must be a non-empty string, got {query_name!r}")
        self.table = table_path(table)  # InvalidArgumentError for a scheme Delta is not written to here
        self.app_id = f"liftbridge-query:{query_name}"
        self._settings = settings
        self._format: DeltaFormat | None = None
        self._lock = threading.Lock()

    def _table(self, spark: SparkSession | None) -> DeltaFormat:
        """The table as :class:`DeltaFormat` holds it (its S3 settings resolved once), read anew."""
        with self._lock:
            if self._format is None:
                settings = self._settings
                if settings is None and s3_location(self.table) is not None:
                    session = spark or SparkSession.getActiveSession()
                    if session is None:
                        raise InvalidArgumentError(
                            f"the Delta table {self.table} is on S3: give DeltaBatchWriter settings=, or call it "
                            "from a Spark session whose S3A settings reach the bucket"
                        )
                    settings = session_s3_settings(session, self.table, os.environ)
                self._format = DeltaFormat(self.table, settings)
            table = self._format
        table.refresh()
        return table

    def committed_batch(self) -> int | None:
        """The last micro-batch id the table holds for this query (None: none yet)."""
        return self._table(None).delta.transaction_version(self.app_id)

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        spark = frame.sparkSession
        table = self._table(spark)
        done = table.delta.transaction_version(self.app_id)
        if done is not None and batch_id <= done:
            log.info(
                "micro-batch %d of %s is in %s already (up to %d): skipped", batch_id, self.app_id, self.table, done
            )
            return
        name = f"liftbridge-batch-{batch_id}-{uuid.uuid4().hex[:12]}"
        with micros_timestamps(spark):
            written = table.write(spark, frame, name)
        fault_points.reached("delta.batch_written")
        try:
            _commit(table.delta, written.handle, {self.app_id: batch_id}, self.app_id)
        except CommitFailedError:
            table.discard(written)
            committed = self.committed_batch()
            if committed is None or committed < batch_id:
                raise
            log.info("micro-batch %d of %s was committed by another writer: skipped", batch_id, self.app_id)
