"""The lake's files through Hadoop's FileSystem (any scheme Spark can write: file, hdfs, s3a, abfs, gs...).

Paths are strings (URIs or plain paths, which Hadoop resolves like Spark
does), so the ledger, the manifests and the data land on the same
filesystem. The ledger needs two things Hadoop does not promise everywhere:

- **create-if-absent** (``create_exclusive``): on ``file:`` paths a hard link
  of a complete temporary file (``link(2)`` fails with EEXIST atomically;
  Hadoop's local ``create(path, overwrite=false)`` checks, then creates, and
  two racing creators both "won" 70 of 500 races). On a filesystem that
  declares conditional create (S3A on Hadoop 3.4.2+ with
  ``fs.s3a.create.conditional.enabled=true``) it asks for it through the
  create builder (``must("fs.option.create.conditional.overwrite", true)``:
  ``If-None-Match: *`` on the PUT at ``close()``, which fails with
  ``RemoteFileChangedException``, HTTP 412, when the key exists; a plain
  ``create(path, false)`` is not conditional on S3A). On other object stores it refuses (:class:`NoAtomicCreateError`)
  rather than risk two winners; elsewhere (HDFS) Hadoop's create is atomic.
- **a whole object at its final key** (``rename`` of one file): ``file:``
  links then unlinks (fails when the target exists); Hadoop's rename
  elsewhere (atomic on HDFS; on S3A one server-side copy of one object, which
  appears whole, then a delete).

:class:`CountingStore` counts the requests a run makes (docs/spark.md, "Object storage").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any, NamedTuple

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from liftbridge_provider.core.lake import LakeError, MissingFileError

CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite"
"""Hadoop's option and path capability for a create that fails when the file exists (HADOOP-19256)."""

OBJECT_STORES = frozenset({"s3a", "s3", "s3n", "gs", "abfs", "abfss", "wasb", "wasbs", "oss", "cos", "cosn", "obs"})
"""Schemes whose Hadoop create(overwrite=false) checks, then creates (no atomic create-if-absent)."""

S3A_SETTINGS = "fs.s3a.create.conditional.enabled=true (Hadoop 3.4.2+; the default in 3.5.0)"


class NoAtomicCreateError(LakeError):
    """The lake's filesystem offers no atomic create-if-absent, so two runs could both claim the same offsets."""


class PieceStats(NamedTuple):
    """What Parquet files hold: rows, and the smallest and largest value of one column."""

    rows: int
    min_offset: int | None
    max_offset: int | None


class HadoopStore:
    """Files of the lake on the filesystem of ``root`` (the output folder), from the driver (thread-safe).

    :param atomic_local: on ``file:`` paths use the POSIX calls above (default
        True; False uses Hadoop's calls there too, for tests of that path).
    """

    def __init__(self, spark: SparkSession | None, root: str, *, atomic_local: bool = True, hadoop: Any = None) -> None:
        """``hadoop``: (the driver's JVM, a Hadoop configuration) when there is no session (``spark`` None)."""
        jvm: Any
        jvm, self._conf = hadoop if spark is None else (spark._jvm, spark._jsc.hadoopConfiguration())
        self._jvm = jvm
        root_path = jvm.org.apache.hadoop.fs.Path(root)
        self._fs = root_path.getFileSystem(self._conf)
        self.root = str(self._fs.makeQualified(root_path).toString()).rstrip("/")
        self.scheme = str(self._fs.getUri().getScheme() or "file")
        self.local = atomic_local and self.scheme == "file"
        self.conditional = bool(self._fs.hasPathCapability(self._path(self.root), CONDITIONAL_CREATE))
        self._local_root = self._jvm_local_path(self.root) if self.scheme == "file" else ""

    def _path(self, path: str) -> Any:
        return self._fs.makeQualified(self._jvm.org.apache.hadoop.fs.Path(path))

    def qualify(self, path: str) -> str:
        """The fully qualified URI of ``path`` (e.g. ``file:/data/lake``)."""
        return str(self._path(path).toString())

    def local_path(self, path: str) -> str:
        """The POSIX path of a ``file:`` path: the folder Hadoop lists for it. (Its URI's path, decoded once by
        Hadoop; parsing :meth:`qualify`'s text as a URL decoded '%' a second time and cut at '#' or '?'.) A path
        under :attr:`root`, as the job builds them, is the root's POSIX path and the rest as written, without
        the four JVM calls per path that made 256 partitions' ledger work take seconds."""
        if self._local_root and path.startswith(self.root + "/") and "//" not in path[len(self.root) :]:
            return self._local_root.rstrip("/") + path[len(self.root) :]
        return self._jvm_local_path(path)

    def _jvm_local_path(self, path: str) -> str:
        return str(self._fs.makeQualified(self._path(path)).toUri().getPath())

    def check_create_exclusive(self) -> None:
        """NoAtomicCreateError, naming what to set, when this filesystem cannot create a file exclusively."""
        if self.local or self.conditional or self.scheme not in OBJECT_STORES:
            return
        settings = S3A_SETTINGS if self.scheme.startswith("s3") else f"conditional create ({CONDITIONAL_CREATE})"
        raise NoAtomicCreateError(
            f"{self.root}: the {self.scheme}: filesystem does not declare an atomic create-if-absent, so two runs "
            f"could claim the same offsets; set {settings} with a store that honours If-None-Match, "
            "or keep the lake where create-if-absent is atomic (docs/spark.md, 'Object storage')"
        )

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(self._path(path)))

    def list_names(self, folder: str) -> list[str]:
        """Names directly in ``folder`` (files and folders; none when it does not exist): one LIST."""
        if self.local:
            try:
                return sorted(os.listdir(self.local_path(folder)))
            except FileNotFoundError:
                return []
        try:
            return sorted(str(status.getPath().getName()) for status in self._fs.listStatus(self._path(folder)))
        except Exception as exc:
            if "FileNotFoundException" in _java_class(exc):
                return []
            raise

    def list_files(self, folder: str) -> list[tuple[str, int]]:
        """Every file under ``folder``, at any depth: (path relative to ``folder``, bytes); one listing (on S3A
        a flat LIST of the prefix, a request per 1,000 keys)."""
        if self.local:
            root = self.local_path(folder)
            return sorted(
                (os.path.relpath(os.path.join(here, name), root), os.path.getsize(os.path.join(here, name)))
                for here, _, names in os.walk(root)
                for name in names
            )
        base = self._path(folder)
        prefix = str(base.toUri().getPath()).rstrip("/") + "/"
        found = []
        try:
            files = self._fs.listFiles(base, True)
            while files.hasNext():
                status = files.next()
                found.append((str(status.getPath().toUri().getPath())[len(prefix) :], int(status.getLen())))
        except Exception as exc:
            if "FileNotFoundException" in _java_class(exc):
                return []
            raise
        return sorted(found)

    def read(self, path: str) -> bytes:
        """The file's bytes; MissingFileError when it does not exist."""
        if self.local:
            try:
                with open(self.local_path(path), "rb") as handle:
                    return handle.read()
            except FileNotFoundError:
                raise MissingFileError(f"{path} does not exist") from None
        try:
            stream = self._fs.open(self._path(path))
            try:  # S3A asks for the bytes only here: a delete since the open is found now
                return bytes(stream.readAllBytes())
            finally:
                stream.close()
        except Exception as exc:
            if "FileNotFoundException" in _java_class(exc):
                raise MissingFileError(f"{path} does not exist") from None
            raise

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
        self.check_create_exclusive()
        target = self._path(path)
        if self.conditional:
            builder = self._fs.createFile(target).overwrite(False).must(CONDITIONAL_CREATE, True)
            stream = builder.build()
        else:
            try:
                stream = self._fs.create(target, False)
            except Exception as exc:  # py4j wraps the Java exception
                if "FileAlreadyExistsException" in _java_class(exc):
                    return False
                raise
        try:
            stream.write(bytearray(data))
        finally:
            try:
                stream.close()  # an object store's conditional PUT happens here
            except Exception as exc:
                if _lost_conditional_create(exc):
                    return False
                raise
        return True

    def delete_files(self, folder: str, names: Sequence[str]) -> None:
        """Delete these files of ``folder``; missing ones are no error. One bulk request per page where the
        filesystem has bulk delete (S3A: DeleteObjects, 250 keys a page by default), else one per file."""
        if not names:
            return
        if self.local:
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.local_path(folder), name))
            return
        base = self._path(folder)
        if self._fs.hasPathCapability(base, "fs.capability.bulk.delete"):
            bulk = self._fs.createBulkDelete(base)
            try:
                page = max(1, int(bulk.pageSize()))
                for first in range(0, len(names), page):
                    paths = self._jvm.java.util.ArrayList()
                    for name in names[first : first + page]:
                        paths.add(self._jvm.org.apache.hadoop.fs.Path(base, name))
                    failures = bulk.bulkDelete(paths)
                    if not failures.isEmpty():
                        raise LakeError(f"could not delete {failures.size()} file(s) of {folder}: {failures}")
            finally:
                bulk.close()
            return
        for name in names:
            self._fs.delete(self._jvm.org.apache.hadoop.fs.Path(base, name), False)

    def object_size(self, path: str) -> int | None:
        """The bytes of a file, -1 for a folder, None when nothing is there."""
        if self.local:
            try:
                stat = os.stat(self.local_path(path))
            except FileNotFoundError:
                return None
            return -1 if os.path.isdir(self.local_path(path)) else stat.st_size
        try:
            status = self._fs.getFileStatus(self._path(path))
        except Exception as exc:
            if "FileNotFoundException" in _java_class(exc):
                return None
            raise
        return -1 if status.isDirectory() else int(status.getLen())

    def mkdirs(self, folder: str) -> None:
        self._fs.mkdirs(self._path(folder))

    def rename(self, source: str, target: str) -> bool:
        """Move a file (or a folder) ``source`` to ``target``, which must not exist; False when it did not move."""
        if self.local:
            source_path, target_path = self.local_path(source), self.local_path(target)
            try:
                os.makedirs(os.path.dirname(target_path), exist_ok=True)
                if os.path.isdir(source_path):
                    os.rename(source_path, target_path)  # a legacy folder: fails onto a non-empty folder
                else:
                    os.link(source_path, target_path)  # fails when the target exists
                    os.unlink(source_path)
            except OSError:
                return False
            return True
        try:
            return bool(self._fs.rename(self._path(source), self._path(target)))
        except Exception as exc:  # the source vanished (another writer moved it) or the target appeared
            if "FileNotFoundException" in _java_class(exc) or "FileAlreadyExistsException" in _java_class(exc):
                return False
            raise

    def parquet_stats(self, path: str, column: str) -> PieceStats:
        """Rows and the smallest and largest ``column`` value of a Parquet file, or of the Parquet files in a
        folder, from their footers (Parquet's own reader in the JVM, on any filesystem Spark writes; pyarrow's
        on ``file:`` paths): no Spark job.

        Raises LakeError when a row group with rows has no statistics for ``column``.
        """
        if self.local:
            return _local_parquet_stats(self.local_path(path), column)
        target = self._path(path)
        status = self._fs.getFileStatus(target)
        statuses = self._fs.listStatus(target) if status.isDirectory() else [status]
        total = PieceStats(0, None, None)
        for each in statuses:
            name = str(each.getPath().getName())
            if name.endswith(".parquet") and not name.startswith(("_", ".")):
                total = _merge(total, self._jvm_file_stats(each, column))
        return total

    def _jvm_file_stats(self, status: Any, column: str) -> PieceStats:
        jvm = self._jvm
        source = jvm.org.apache.parquet.hadoop.util.HadoopInputFile.fromStatus(status, self._conf)
        reader = jvm.org.apache.parquet.hadoop.ParquetFileReader.open(source)
        total = PieceStats(0, None, None)
        try:
            for block in reader.getFooter().getBlocks():
                count = int(block.getRowCount())
                if not count:
                    continue
                chunk = next((c for c in block.getColumns() if str(c.getPath().toDotString()) == column), None)
                stats = chunk.getStatistics() if chunk is not None else None
                if stats is None or not stats.hasNonNullValue():
                    raise LakeError(f"{status.getPath()} keeps no {column} statistics for {count} rows")
                total = _merge(total, PieceStats(count, int(stats.genericGetMin()), int(stats.genericGetMax())))
        finally:
            reader.close()
        return total

    def delete(self, path: str) -> None:
        """Delete a file or a folder with its contents (nothing when it does not exist)."""
        if self.local:
            target = self.local_path(path)
            if os.path.isdir(target):
                shutil.rmtree(target, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(target)
            return
        self._fs.delete(self._path(path), True)

    def s3a_requests(self) -> dict[str, int]:
        """The filesystem's own request counters so far (S3A's IOStatistics: object_list_request,
        object_put_request, ...); empty where the filesystem keeps none."""
        support = self._jvm.org.apache.hadoop.fs.statistics.IOStatisticsSupport
        statistics = support.retrieveIOStatistics(self._fs)
        if statistics is None:
            return {}
        counters = statistics.counters()
        return {str(k): int(counters.get(k)) for k in counters.keySet() if str(k).endswith("_request")}


class CountingStore:
    """A LedgerStore that counts the requests it passes on, by operation (thread-safe).

    One count per request the operation makes on an object store: ``list``,
    ``read``, ``create``, ``size``, ``rename``, and ``delete`` per file (a bulk
    delete of a page is one request on S3A; counted per file, the upper bound).
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _count(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.counts[kind] += n

    def __getattr__(self, name: str) -> Any:  # anything else (root, parquet_stats, ...) goes to the store
        return getattr(self.store, name)

    def list_names(self, folder: str) -> list[str]:
        self._count("list")
        return list(self.store.list_names(folder))

    def read(self, path: str) -> bytes:
        self._count("read")
        return bytes(self.store.read(path))

    def create_exclusive(self, path: str, data: bytes) -> bool:
        self._count("create")
        return bool(self.store.create_exclusive(path, data))

    def delete_files(self, folder: str, names: Sequence[str]) -> None:
        self._count("delete", len(names))
        self.store.delete_files(folder, names)

    def object_size(self, path: str) -> int | None:
        self._count("size")
        size: int | None = self.store.object_size(path)
        return size

    def rename(self, source: str, target: str) -> bool:
        self._count("rename")
        return bool(self.store.rename(source, target))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _merge(a: PieceStats, b: PieceStats) -> PieceStats:
    lows = [v for v in (a.min_offset, b.min_offset) if v is not None]
    highs = [v for v in (a.max_offset, b.max_offset) if v is not None]
    return PieceStats(a.rows + b.rows, min(lows, default=None), max(highs, default=None))


def _local_parquet_stats(path: str, column: str) -> PieceStats:
    """:meth:`HadoopStore.parquet_stats` of a local file or folder, the footers read by pyarrow: the same answer
    without a JVM call per file, row group and column."""
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if n.endswith(".parquet") and not n.startswith(("_", ".")))
        files = [os.path.join(path, n) for n in names]
    else:
        files = [path]
    total = PieceStats(0, None, None)
    for file in files:
        metadata = pq.read_metadata(file)
        for index in range(metadata.num_row_groups):
            block = metadata.row_group(index)
            count = block.num_rows
            if not count:
                continue
            chunk = next((c for c in map(block.column, range(block.num_columns)) if c.path_in_schema == column), None)
            stats = chunk.statistics if chunk is not None else None
            if stats is None or not stats.has_min_max:
                raise LakeError(f"file:{file} keeps no {column} statistics for {count} rows")
            total = _merge(total, PieceStats(count, int(stats.min), int(stats.max)))
    return total


def _java_class(exc: Exception) -> str:
    java = getattr(exc, "java_exception", None)
    return str(java.getClass().getName()) if java is not None else type(exc).__name__


def _lost_conditional_create(exc: Exception) -> bool:
    """Whether a close failed because the key existed: S3A's RemoteFileChangedException from a 412 (or a
    FileAlreadyExistsException from a filesystem that checks at close)."""
    name = _java_class(exc)
    if "FileAlreadyExistsException" in name:
        return True
    if "RemoteFileChangedException" not in name:
        return False
    try:
        status: int | None = int(exc.java_exception.getCause().statusCode())  # type: ignore[attr-defined]
    except Exception:  # no cause, or a cause without an HTTP status
        status = None
    return status == 412 or (status is None and "412" in str(exc))


def _link_exclusive(path: str, data: bytes) -> bool:
    """Write ``data`` to a temporary file beside ``path`` and hard-link it there: atomic create-if-absent."""
    folder = os.path.dirname(path)
    temporary = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:  # the folder is made only when missing: it exists after a ledger's first claim, and a mkdir costs
        handle = open(temporary, "xb")  # noqa: SIM115 (closed by the with below)
    except FileNotFoundError:
        os.makedirs(folder, exist_ok=True)
        handle = open(temporary, "xb")  # noqa: SIM115
    with handle:
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


LakeStore = HadoopStore | CountingStore
"""What the Parquet job's code takes: the store itself, or the store behind a request counter."""
