"""What the lake records of a run's ranges, read in the API server for the Liftbridge page's Runs view.

Read-only, and the lake's own record (a data file is read only where the record cannot say, and bounded):

* Parquet: each range's partition's claim ledger (``core/lake_ledger.py``), through :class:`ReadOnlyStore` on
  pyarrow's filesystems (a local path, ``file:``, or ``s3a://`` with the S3 settings of an ``aws`` connection,
  ``hooks/object_store.aws_s3_settings``): the committed pieces over the range and their rows;
* Delta: the table's application transactions (delta-rs, ``core/delta_plan.read_holdings``): the offsets held;
  and its add actions' statistics: the rows of the live data files over each range (``table_files.py``);
* Iceberg: the table properties of the embedded SQLite catalog in a local output folder (pyiceberg,
  ``core/iceberg_plan.read_holdings``), and the current snapshot's data files over each range; an Iceberg
  lake on object storage has its catalog elsewhere and is not read.

A data file that holds offsets on both sides of a range's boundary (after an OPTIMIZE or a compaction) has
its ``offset`` column read to count its rows in the range exactly (``table_files.rows_in_file``; at most
``bounds.STRADDLING_FILE_READS`` files per run); a file without statistics makes the range's rows unknown,
with the reason.

Each read runs on the page's thread pool and is waited for at most ``bounds.READ_TIMEOUT`` for all runs
together (``runs_service.py``); a failure is shown as its text, without the lake's keys.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from liftbridge_provider.core.iceberg_plan import table_identifier
from liftbridge_provider.core.lake import MissingFileError
from liftbridge_provider.core.lake_ledger import Ledger
from liftbridge_provider.core.object_store import S3Settings
from liftbridge_provider.core.s3_sources import library_uri, s3_location
from liftbridge_provider.ui.runs import IngestCall, parquet_range
from liftbridge_provider.ui.table_files import delta_file_path, delta_files, iceberg_files, table_ranges

READER = "liftbridge-ui-reader"  # the Ledger's run id: never written, a reader only


class ReadOnlyStore:
    """The reading half of a ``LedgerStore`` on a pyarrow filesystem; every write refuses."""

    def __init__(self, filesystem: Any, root: str) -> None:
        self._fs = filesystem
        self.root = root.rstrip("/")

    def list_names(self, folder: str) -> list[str]:
        from pyarrow import fs  # noqa: PLC0415

        try:
            infos = self._fs.get_file_info(fs.FileSelector(folder, allow_not_found=True))
        except FileNotFoundError:
            return []
        return sorted(info.base_name for info in infos)

    def read(self, path: str) -> bytes:
        try:
            with self._fs.open_input_stream(path) as stream:
                return bytes(stream.read())
        except FileNotFoundError:
            raise MissingFileError(f"{path} is gone") from None

    def open_file(self, path: str) -> Any:
        """``path`` opened for reading (a pyarrow random-access file: a context manager)."""
        return self._fs.open_input_file(path)

    def object_size(self, path: str) -> int | None:
        from pyarrow import fs  # noqa: PLC0415

        info = self._fs.get_file_info(path)
        if info.type == fs.FileType.NotFound:
            return None
        return -1 if info.type == fs.FileType.Directory else int(info.size)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        raise PermissionError("the Liftbridge page never writes to the lake")

    def delete_files(self, folder: str, names: Sequence[str]) -> None:
        raise PermissionError("the Liftbridge page never writes to the lake")

    def rename(self, source: str, target: str) -> bool:
        raise PermissionError("the Liftbridge page never writes to the lake")


def _local(output: str) -> str:
    """A local lake's path: ``output`` without its ``file:`` or ``file://`` scheme (others unchanged)."""
    for prefix in ("file://", "file:"):
        if output.startswith(prefix):
            return output[len(prefix) :]
    return output


def parquet_store(output: str, settings: S3Settings | None) -> ReadOnlyStore:
    """A read-only store rooted at the lake ``output`` (its root path in the store is ``store.root``)."""
    from pyarrow import fs  # noqa: PLC0415

    location = s3_location(output)
    if location is None:
        return ReadOnlyStore(fs.LocalFileSystem(), _local(output))
    if settings is None:
        raise ValueError("a lake on S3 needs an aws connection's settings to be read")
    bucket, key = location
    return ReadOnlyStore(fs.S3FileSystem(**settings.pyarrow_options()), f"{bucket}/{key}".rstrip("/"))


def parquet_ranges(call: IngestCall, settings: S3Settings | None) -> list[dict[str, Any]]:
    """Each range of ``call`` with the rows its partition's claim ledger holds over it."""
    assert call.ranges is not None
    store = parquet_store(call.output, settings)
    folder = f"{store.root}/stream={call.ranges.stream}"
    found = []
    for offset_range in call.ranges.ranges:
        start, end = offset_range.start, offset_range.end
        ledger = Ledger(store, folder, offset_range.partition, READER, settle_timeout=0.0)
        state = ledger.read()
        claims = [*ledger.folded(state, start, end), *state.recent]
        found.append(parquet_range(offset_range.partition, start, end, claims))
    return found


def delta_ranges(call: IngestCall, settings: S3Settings | None) -> list[dict[str, Any]]:
    """Each range of ``call`` with the offsets the Delta table's application transactions hold of it and the
    rows of its live data files over it (the add actions' statistics of the table's current version)."""
    from deltalake import DeltaTable  # noqa: PLC0415

    from liftbridge_provider.core.delta_plan import read_holdings  # noqa: PLC0415

    assert call.ranges is not None
    store = parquet_store(call.output, settings)  # first: a table on S3 without settings is refused, not asked
    options = settings.delta_storage_options() if settings and s3_location(call.output) else None
    table = DeltaTable(library_uri(_local(call.output)), storage_options=options)
    stream = call.ranges.stream
    files = delta_files(table)
    return table_ranges(
        call.ranges.ranges,
        lambda partition: read_holdings(stream, partition, table.transaction_version, lambda: None),
        lambda _: files,
        lambda path: store.open_file(delta_file_path(store.root, path)),
    )


def iceberg_ranges(call: IngestCall, settings: S3Settings | None) -> list[dict[str, Any]]:
    """Each range of ``call`` with the offsets the Iceberg table's properties hold of it and the rows of the
    current snapshot's data files over it: the job's embedded SQL catalog in a local output only, under the
    job's catalog name (``--iceberg-catalog``: the catalog keys its tables by it) and table name."""
    from pyiceberg.catalog import load_catalog  # noqa: PLC0415

    from liftbridge_provider.core.iceberg_plan import read_holdings  # noqa: PLC0415

    assert call.ranges is not None
    if s3_location(call.output) is not None:
        raise ValueError("an Iceberg lake on object storage keeps its catalog elsewhere: not read by this page")
    if call.iceberg_catalog_given:
        raise ValueError("the run names its Iceberg catalog (--iceberg-catalog-property): not read by this page")
    folder = _local(call.output).rstrip("/")
    if not os.path.isfile(f"{folder}/catalog.db"):  # opening a missing SQLite catalog would create it
        raise ValueError(f"no Iceberg catalog at {folder}/catalog.db (the run has not created its table yet)")
    catalog = load_catalog(
        call.iceberg_catalog, type="sql", uri=f"sqlite:///{folder}/catalog.db", warehouse=f"file://{folder}"
    )
    stream = call.ranges.stream
    table = catalog.load_table(table_identifier(stream, call.iceberg_table))
    properties = dict(table.properties)
    return table_ranges(
        call.ranges.ranges,
        lambda partition: read_holdings(stream, partition, properties),
        lambda offset_range: iceberg_files(table, offset_range),
        lambda path: table.io.new_input(path).open(),
    )


READERS: dict[str, Callable[[IngestCall, S3Settings | None], list[dict[str, Any]]]] = {
    "parquet": parquet_ranges,
    "delta": delta_ranges,
    "iceberg": iceberg_ranges,
}


def read_record(call: IngestCall, settings: S3Settings | None) -> dict[str, Any]:
    """``{"ranges": [...]}`` as the lake records ``call``'s ranges; raises what the read raised."""
    if call.ranges is None:
        return {"ranges": None, "error": "the run's ranges are not in its arguments or its freeze's XCom"}
    reader = READERS.get(call.lake_format)
    if reader is None:
        return {"ranges": None, "error": f"unknown lake format {call.lake_format!r}"}
    return {"ranges": reader(call, settings)}
