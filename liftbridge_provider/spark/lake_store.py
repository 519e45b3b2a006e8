"""The lake's files through Hadoop's FileSystem (any scheme Spark can write: file, hdfs, s3a, abfs, gs...).

Paths are strings (URIs or plain paths, which Hadoop resolves like Spark
does), so the ledger, the manifests and the data land on the same
filesystem. Two operations need more than Hadoop promises:

- **create-if-absent**: Hadoop's ``create(path, overwrite=false)`` checks,
  then creates, on the local filesystem (two racing creators can both
  "win"). On ``file:`` paths it is done with a hard link of
  a complete temporary file (``link(2)`` fails with EEXIST atomically), so the
  file appears whole or not at all. Other schemes use Hadoop's create, atomic
  on HDFS; object stores (S3A, GCS, ABFS) do not promise it, see docs/spark.md.
- **rename of a folder**: on ``file:`` paths ``os.rename`` (atomic, fails onto
  a non-empty folder); elsewhere Hadoop's rename (atomic on HDFS).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import Any, NamedTuple

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from liftbridge_provider.core.lake import LakeError


class PieceStats(NamedTuple):
    """What a folder of Parquet files holds: rows, and the smallest and largest value of one column."""

    rows: int
    min_offset: int | None
    max_offset: int | None


class HadoopStore:
    """Files of the lake on the filesystem of ``root`` (the output folder), from the driver.

    :param atomic_local: on ``file:`` paths use the POSIX calls above (default
        True; False uses Hadoop's calls there too, for tests of that path).
    """

    def __init__(self, spark: SparkSession, root: str, *, atomic_local: bool = True) -> None:
        jvm: Any = spark._jvm
        self._jvm = jvm
        self._conf = spark._jsc.hadoopConfiguration()
        root_path = jvm.org.apache.hadoop.fs.Path(root)
        self._fs = root_path.getFileSystem(self._conf)
        self.root = str(self._fs.makeQualified(root_path).toString()).rstrip("/")
        self.scheme = str(self._fs.getUri().getScheme() or "file")
        self.local = atomic_local and self.scheme == "file"

    def _path(self, path: str) -> Any:
        return self._fs.makeQualified(self._jvm.org.apache.hadoop.fs.Path(path))

    def qualify(self, path: str) -> str:
        """The fully qualified URI of ``path`` (e.g. ``file:/data/lake``)."""
        return str(self._path(path).toString())

    def local_path(self, path: str) -> str:
        """The POSIX path of a ``file:`` path: the folder Hadoop lists for it. (Its URI's path, decoded once by
        Hadoop; parsing :meth:`qualify`'s text as a URL decoded '%' a second time and cut at '#' or '?'.)"""
        return str(self._fs.makeQualified(self._path(path)).toUri().getPath())

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(self._path(path)))

    def list_names(self, folder: str) -> list[str]:
        """Names directly in ``folder`` (files and folders; none when it does not exist)."""
        target = self._path(folder)
        if not self._fs.exists(target):
            return []
        return sorted(str(status.getPath().getName()) for status in self._fs.listStatus(target))

    def read(self, path: str) -> bytes:
        stream = self._fs.open(self._path(path))
        try:
            return bytes(stream.readAllBytes())
        finally:
            stream.close()

    def write(self, path: str, data: bytes) -> None:
        """Create or replace ``path`` with ``data`` (parents created)."""
        stream = self._fs.create(self._path(path), True)
        try:
            stream.write(bytearray(data))
        finally:
            stream.close()

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` holding ``data`` unless it exists; False when it existed (see the module docs)."""
        if self.local:
            return _link_exclusive(self.local_path(path), data)
        self._fs.mkdirs(self._path(path).getParent())
        try:
            stream = self._fs.create(self._path(path), False)
        except Exception as exc:  # py4j wraps the Java exception
            if "FileAlreadyExistsException" in _java_class(exc):
                return False
            raise
        try:
            stream.write(bytearray(data))
        finally:
            stream.close()
        return True

    def mkdirs(self, folder: str) -> None:
        self._fs.mkdirs(self._path(folder))

    def rename(self, source: str, target: str) -> bool:
        """Move folder ``source`` to ``target`` (which must not exist); False when it did not move."""
        if self.local:
            try:
                os.rename(self.local_path(source), self.local_path(target))
            except OSError:
                return False
            return True
        try:
            return bool(self._fs.rename(self._path(source), self._path(target)))
        except Exception as exc:  # the source vanished (another writer moved it) or the target appeared
            if "FileNotFoundException" in _java_class(exc) or "FileAlreadyExistsException" in _java_class(exc):
                return False
            raise

    def parquet_stats(self, folder: str, column: str) -> PieceStats:
        """Rows and the smallest and largest ``column`` value of the Parquet files in ``folder``, from their
        footers (Parquet's own reader in the JVM, on any filesystem Spark writes; pyarrow's on ``file:`` paths):
        no Spark job.

        Raises LakeError when a row group with rows has no statistics for ``column``.
        """
        if self.local:
            return _local_parquet_stats(self.local_path(folder), column)
        jvm = self._jvm
        rows, low, high = 0, None, None
        for status in self._fs.listStatus(self._path(folder)):
            name = str(status.getPath().getName())
            if not name.endswith(".parquet") or name.startswith(("_", ".")):
                continue
            source = jvm.org.apache.parquet.hadoop.util.HadoopInputFile.fromStatus(status, self._conf)
            reader = jvm.org.apache.parquet.hadoop.ParquetFileReader.open(source)
            try:
                for block in reader.getFooter().getBlocks():
                    count = int(block.getRowCount())
                    if not count:
                        continue
                    rows += count
                    chunk = next((c for c in block.getColumns() if str(c.getPath().toDotString()) == column), None)
                    stats = chunk.getStatistics() if chunk is not None else None
                    if stats is None or not stats.hasNonNullValue():
                        raise LakeError(f"{status.getPath()} keeps no {column} statistics for {count} rows")
                    block_low, block_high = int(stats.genericGetMin()), int(stats.genericGetMax())
                    low = block_low if low is None else min(low, block_low)
                    high = block_high if high is None else max(high, block_high)
            finally:
                reader.close()
        return PieceStats(rows, low, high)

    def delete(self, path: str) -> None:
        """Delete a file or a folder with its contents (nothing when it does not exist)."""
        self._fs.delete(self._path(path), True)


def _local_parquet_stats(folder: str, column: str) -> PieceStats:
    """:meth:`HadoopStore.parquet_stats` of a local folder, the footers read by pyarrow: the same answer
    without a JVM call per file, row group and column."""
    rows, low, high = 0, None, None
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".parquet") or name.startswith(("_", ".")):
            continue
        path = os.path.join(folder, name)
        metadata = pq.read_metadata(path)
        for index in range(metadata.num_row_groups):
            block = metadata.row_group(index)
            count = block.num_rows
            if not count:
                continue
            rows += count
            chunk = next((c for c in map(block.column, range(block.num_columns)) if c.path_in_schema == column), None)
            stats = chunk.statistics if chunk is not None else None
            if stats is None or not stats.has_min_max:
                raise LakeError(f"file:{path} keeps no {column} statistics for {count} rows")
            block_low, block_high = int(stats.min), int(stats.max)
            low = block_low if low is None else min(low, block_low)
            high = block_high if high is None else max(high, block_high)
    return PieceStats(rows, low, high)


def _java_class(exc: Exception) -> str:
    java = getattr(exc, "java_exception", None)
    return str(java.getClass().getName()) if java is not None else type(exc).__name__


def _link_exclusive(path: str, data: bytes) -> bool:
    """Write ``data`` to a temporary file beside ``path`` and hard-link it there: atomic create-if-absent."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(temporary, path)
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)  # the new name survives a crash of the machine
    finally:
        os.close(descriptor)
    return True
