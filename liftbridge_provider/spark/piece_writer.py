"""Staging a run's pieces from inside the Spark tasks that read them: one Parquet object per piece, written with
pyarrow, and each piece's rows, bytes and offset bounds sent back to the driver.

Spark's own file writer (``DataFrameWriter.parquet`` with ``partitionBy``) pays a writer set-up per file and
its commit protocol's moves, which grow with the number of pieces; reading the footers back costs a request
per object. A task here writes the rows of each piece it reads to
``<staging folder>/p=<partition>-claim=<seq>-<attempt>.parquet`` (one folder: no directory per piece) and
returns one row per piece
(:data:`STATS_SCHEMA`); the driver commits exactly the objects the successful attempts returned.

Rules:

- each task attempt writes objects of its own name (a random id), so an attempt that was killed part
  way can leave an object behind but never one the driver uses: the driver names what it commits from the
  returned rows, and deletes the staging folder at the end; an attempt that fails deletes what it wrote;
- an object is closed before its row is returned, so a returned object is whole (on S3 an upload appears whole
  when it completes; on a local disk it is renamed into place from a hidden name after it is closed);
- a piece with no rows has no object and no row (compaction or retention emptied it).

Where the lake is on a local disk or on S3 with settings pyarrow can sign with
(:func:`liftbridge_provider.spark.parquet_ingest.staging_target`); any other filesystem (HDFS, S3 through a
credential provider pyarrow cannot use) keeps Spark's writer.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from liftbridge_provider.core.object_store import S3Settings

STATS_SCHEMA = "partition int, claim long, path string, bytes long, rows long, min_offset long, max_offset long"
"""What a task returns per piece it staged (``path`` relative to the stream's folder)."""

CODECS = {"none": "none", "uncompressed": "none", "snappy": "snappy", "gzip": "gzip", "zstd": "zstd"}
"""Spark's ``spark.sql.parquet.compression.codec`` values pyarrow writes alike; another codec keeps Spark's
writer."""

TIMESTAMPS: dict[str, dict[str, Any]] = {
    "INT96": {"use_deprecated_int96_timestamps": True},
    "TIMESTAMP_MICROS": {"coerce_timestamps": "us"},
    "TIMESTAMP_MILLIS": {"coerce_timestamps": "ms", "allow_truncated_timestamps": True},
}
"""pyarrow's writer options for each ``spark.sql.parquet.outputTimestampType`` (Spark's default: INT96), so a
piece the tasks write stores its timestamps as Spark's writer would: a lake whose earlier pieces Spark wrote
keeps one physical type, which readers other than Spark (pyarrow, DuckDB) need to read it as one table."""


@dataclass(frozen=True)
class StagingTarget:
    """Where a run's tasks stage their pieces.

    :param folder: the run's staging folder: a POSIX path, or ``bucket/key`` on S3.
    :param relative: the same folder relative to the stream's folder (``_staging/<run>``), which the paths
        returned to the driver start with.
    :param tag_column: the column that holds each row's piece (claim sequence number); not written.
    :param compression: pyarrow's name of the codec (:data:`CODECS`).
    :param timestamps: Spark's ``spark.sql.parquet.outputTimestampType`` (:data:`TIMESTAMPS`; default INT96).
    :param s3: the settings of the S3 store the folder is on; None for a local disk. Shipped to the
        executors inside the task's function, never on a command line or in a log (left out of ``repr``).
    """

    folder: str
    relative: str
    tag_column: str
    compression: str = "snappy"
    timestamps: str = "INT96"
    s3: S3Settings | None = field(default=None, repr=False)

    def filesystem(self) -> pafs.FileSystem:
        if self.s3 is None:
            return pafs.LocalFileSystem()
        return pafs.S3FileSystem(**self.s3.pyarrow_options())


def stage_pieces(target: StagingTarget) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function a ``mapInArrow`` runs in each task: writes the task's pieces, yields their rows
    (:data:`STATS_SCHEMA`)."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fs = target.filesystem()
        if target.s3 is None:
            os.makedirs(target.folder, exist_ok=True)
        attempt = uuid.uuid4().hex
        pieces: dict[tuple[int, int], _Piece] = {}
        try:
            for batch in batches:
                for key, rows in piece_runs(batch, target.tag_column):
                    piece = pieces.get(key)
                    if piece is None:
                        piece = pieces[key] = _Piece.open(fs, target, key, attempt, rows.schema)
                    piece.write(rows)
            stats = [piece.close() for piece in pieces.values()]
        except BaseException:
            for piece in pieces.values():
                piece.abandon()
            raise
        if stats:
            yield pa.RecordBatch.from_pylist(stats, schema=_arrow_stats_schema())

    return write


def _arrow_stats_schema() -> pa.Schema:
    return pa.schema(
        [
            ("partition", pa.int32()),
            ("claim", pa.int64()),
            ("path", pa.string()),
            ("bytes", pa.int64()),
            ("rows", pa.int64()),
            ("min_offset", pa.int64()),
            ("max_offset", pa.int64()),
        ]
    )


def piece_runs(batch: pa.RecordBatch, tag_column: str) -> Iterator[tuple[tuple[int, int], pa.RecordBatch]]:
    """``batch``'s rows in runs of one piece each, ((partition, claim), the run's rows without the tag column).
    A task reads its pieces one after another, so a batch holds few runs; where they change is found by Arrow's
    compute functions over whole columns, not row by row in Python."""
    count = batch.num_rows
    if count == 0:
        return
    names = batch.schema.names
    partitions = batch.column(names.index("partition"))
    tags = batch.column(names.index(tag_column))
    changed = pc.or_(
        pc.not_equal(partitions.slice(1), partitions.slice(0, count - 1)),
        pc.not_equal(tags.slice(1), tags.slice(0, count - 1)),
    )
    starts = [0, *(index + 1 for index in pc.indices_nonzero(pc.fill_null(changed, True)).to_pylist())]
    rows = batch.drop_columns([tag_column])
    for start, end in zip(starts, [*starts[1:], count], strict=True):
        yield (partitions[start].as_py(), tags[start].as_py()), rows.slice(start, end - start)


@dataclass
class _Piece:
    """One piece's object being written by one task attempt."""

    fs: pafs.FileSystem
    path: str  # where it is written (local: a hidden name beside the final one)
    final: str  # where it is once closed
    relative: str  # the final path relative to the stream's folder
    key: tuple[int, int]
    stream: Any
    writer: pq.ParquetWriter
    rows: int = 0
    low: int | None = None
    high: int | None = None

    @classmethod
    def open(
        cls, fs: pafs.FileSystem, target: StagingTarget, key: tuple[int, int], attempt: str, schema: pa.Schema
    ) -> _Piece:
        partition, claim = key
        name = f"p={partition}-claim={claim}-{attempt}.parquet"  # one folder: no directory made per piece
        final = f"{target.folder}/{name}"
        path = final if target.s3 is not None else f"{target.folder}/.{name}.writing"
        stream = fs.open_output_stream(path)
        writer = pq.ParquetWriter(
            stream,
            schema,
            compression=target.compression,
            store_schema=False,  # as Spark's writer: no Arrow schema of its own in the footer
            **TIMESTAMPS[target.timestamps],
        )
        return cls(fs, path, final, f"{target.relative}/{name}", key, stream, writer)

    def write(self, rows: pa.RecordBatch) -> None:
        self.writer.write_batch(rows)
        self.rows += rows.num_rows
        bounds = pc.min_max(rows.column(rows.schema.names.index("offset")))
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low is not None:
            self.low = low if self.low is None else min(self.low, low)
            self.high = high if self.high is None else max(self.high, high)

    def close(self) -> dict[str, Any]:
        """Finish the object (whole once this returns) and say what it holds."""
        self.writer.close()
        size = self.stream.tell()
        self.stream.close()
        if self.path != self.final:
            os.replace(self.path, self.final)
        partition, claim = self.key
        return {
            "partition": partition,
            "claim": claim,
            "path": self.relative,
            "bytes": size,
            "rows": self.rows,
            "min_offset": self.low,
            "max_offset": self.high,
        }

    def abandon(self) -> None:
        """Best effort after a failure: the object is never used (its name is this attempt's own), and is
        deleted. On S3 closing completes the upload (pyarrow's stream has no abort), so it is deleted after."""
        with contextlib.suppress(Exception):  # the failure being raised is the one that matters
            self.writer.close()
        with contextlib.suppress(Exception):  # the writer does not close the stream it was given
            self.stream.close()
        for path in {self.path, self.final}:  # local: the hidden name, or the final one if it was closed
            with contextlib.suppress(Exception):
                self.fs.delete_file(path)
