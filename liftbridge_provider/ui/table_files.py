"""A Delta or Iceberg table's live data files as the Runs view counts them, and the exact count of a file that
straddles a range's boundary (read-only; the decisions are ``file_counts.py``'s).

* Delta: the add actions of the table's current version (delta-rs ``get_add_actions(flatten=True)``): the
  stats the job writes with each file (``numRecords``, min and max ``offset``: ``spark/delta_ingest.py``)
  and its ``partition`` value. A removed file (overwritten, compacted by OPTIMIZE) has no add action there.
* Iceberg: the current snapshot's data files that may hold rows of the range (a scan planned with the filter
  ``partition == p and start <= offset < end``, which skips files by their partition and offset bounds
  without reading them), with their ``record_count``, the lower and upper bounds of ``offset``, the partition
  value and the delete files that apply to them.

A straddling file's rows in the range are counted from its ``offset`` column (:func:`rows_in_file`): only the
row groups whose offset statistics overlap the range, and at most ``bounds.STRADDLING_FILE_READS`` files per
run; beyond that the range's rows are shown as unknown, with the reason. deltalake, pyiceberg and pyarrow
are imported inside the functions: the compat tier imports the page's modules without them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import IO, Any
from urllib.parse import unquote, urlsplit

from liftbridge_provider.core.ranges import OffsetRange
from liftbridge_provider.core.table_plan import Interval
from liftbridge_provider.ui import bounds
from liftbridge_provider.ui.file_counts import DataFile, files_over, settle
from liftbridge_provider.ui.runs import held_range

PARTITION_COLUMN = "partition"  # the Liftbridge partition: the tables' partition column (both formats)
OFFSET_COLUMN = "offset"


def rows_in_file(source: str | IO[bytes], partition: int | None, start: int, end: int) -> int:
    """The rows of the Parquet file ``source`` whose offset is in ``[start, end)`` (and whose ``partition``
    column is ``partition``, when given: for a file whose partition the metadata does not record). Only the
    offset (and partition) column of the row groups whose offset statistics overlap the range is read."""
    import pyarrow.compute as pc  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    parquet = pq.ParquetFile(source)
    metadata = parquet.metadata
    paths = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    columns = [OFFSET_COLUMN] if partition is None else [OFFSET_COLUMN, PARTITION_COLUMN]
    count = 0
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        if not group.num_rows:
            continue
        stats = group.column(paths.index(OFFSET_COLUMN)).statistics
        if stats is not None and stats.has_min_max and (stats.max < start or stats.min >= end):
            continue
        table = parquet.read_row_group(index, columns=columns)
        offsets = table.column(OFFSET_COLUMN)
        keep = pc.and_(pc.greater_equal(offsets, start), pc.less(offsets, end))
        if partition is not None:
            keep = pc.and_(keep, pc.equal(table.column(PARTITION_COLUMN), partition))
        count += int(pc.sum(pc.cast(pc.fill_null(keep, False), "int64")).as_py() or 0)
    return count


def table_ranges(
    ranges: Sequence[OffsetRange],
    held_of: Callable[[int], list[Interval]],
    files_of: Callable[[OffsetRange], Iterable[DataFile]],
    open_file: Callable[[str], Any],
) -> list[dict[str, Any]]:
    """Each range as the table holds it: the offsets its record holds (``held_of(partition)``) and the rows
    of the live data files over it (``files_of(range)``), straddling files counted exactly from
    ``open_file(path)`` (a context manager giving a readable, seekable binary stream), at most
    ``bounds.STRADDLING_FILE_READS`` of them for all the ranges together."""
    found = []
    reads = 0
    for r in ranges:
        held = held_of(r.partition)
        counted = files_over(files_of(r), r.partition, r.start, r.end)
        if counted.unknown is not None:
            found.append(held_range(r.partition, r.start, r.end, held, rows_unknown=counted.unknown))
            continue
        if reads + len(counted.straddling) > bounds.STRADDLING_FILE_READS:
            why = (
                f"{len(counted.straddling)} data files hold offsets on both sides of the range's bounds; the page "
                f"reads at most {bounds.STRADDLING_FILE_READS} such files per run"
            )
            found.append(held_range(r.partition, r.start, r.end, held, rows_unknown=why))
            continue
        exact = {}
        for file in counted.straddling:
            with open_file(file.path) as source:
                exact[file.path] = rows_in_file(
                    source, None if file.partition is not None else r.partition, r.start, r.end
                )
        reads += len(counted.straddling)
        rows, pieces = settle(counted, exact)
        found.append(held_range(r.partition, r.start, r.end, held, rows=rows, pieces=pieces))
    return found


def delta_files(table: Any) -> list[DataFile]:
    """The live data files of the Delta table ``table`` (a ``deltalake.DeltaTable``) from its add actions.

    A file with a deletion vector has fewer rows than its ``numRecords``: marked so (the job never writes
    one; a user's DELETE may)."""
    import pyarrow as pa  # noqa: PLC0415

    actions = pa.table(table.get_add_actions(flatten=True))
    names = set(actions.column_names)

    def column(name: str) -> list[Any]:
        return actions.column(name).to_pylist() if name in names else [None] * actions.num_rows

    vectors = [column(n) for n in sorted(names) if "deletion" in n.lower()]
    files = []
    for index, (path, rows, low, high, partition) in enumerate(
        zip(
            column("path"),
            column("num_records"),
            column(f"min.{OFFSET_COLUMN}"),
            column(f"max.{OFFSET_COLUMN}"),
            column(f"{PARTITION_COLUMN}.{PARTITION_COLUMN}"),
            strict=True,
        )
    ):
        deleted = any(vector[index] is not None for vector in vectors)
        files.append(
            DataFile(
                path,
                None if partition is None else int(partition),
                None if rows is None else int(rows),
                None if low is None else int(low),
                None if high is None else int(high),
                "it has a deletion vector (rows deleted since it was written)" if deleted else None,
            )
        )
    return files


def delta_file_path(root: str, path: str) -> str:
    """Where an add action's ``path`` is on the filesystem that holds the table at ``root``: relative paths
    (percent-encoded, as Delta's log keeps them) under the root; ``file:`` and ``s3://`` URIs as their path,
    and ``bucket/key``."""
    parts = urlsplit(path)
    if parts.scheme == "file":
        return unquote(parts.path)
    if parts.scheme:
        return f"{parts.netloc}{unquote(parts.path)}"
    return f"{root.rstrip('/')}/{unquote(path)}"


def iceberg_files(table: Any, offset_range: OffsetRange) -> list[DataFile]:
    """The data files of the Iceberg table ``table`` (a pyiceberg ``Table``, current snapshot) that may hold
    rows of ``offset_range``: those its scan plans for the range's partition and offsets."""
    from pyiceberg.conversions import from_bytes  # noqa: PLC0415

    schema = table.schema()
    offset = schema.find_field(OFFSET_COLUMN)
    partition = schema.find_field(PARTITION_COLUMN)
    identity = [
        index
        for index, field in enumerate(table.spec().fields)
        if field.source_id == partition.field_id and str(field.transform) == "identity"
    ]
    condition = (  # pyiceberg's filter syntax; the values are the ranges document's integers
        f'"{PARTITION_COLUMN}" = {int(offset_range.partition)} AND "{OFFSET_COLUMN}" >= {int(offset_range.start)} '
        f'AND "{OFFSET_COLUMN}" < {int(offset_range.end)}'
    )

    def bound(bounds_of: dict[int, bytes] | None, field: Any) -> int | None:
        raw = (bounds_of or {}).get(field.field_id)
        return None if raw is None else int(from_bytes(field.field_type, raw))

    files = []
    for task in table.scan(row_filter=condition).plan_files():
        data = task.file
        if identity:
            value = data.partition[identity[0]]
            found = None if value is None else int(value)
        else:  # an unpartitioned table: the partition column's bounds say it when they agree
            low, high = bound(data.lower_bounds, partition), bound(data.upper_bounds, partition)
            found = low if low is not None and low == high else None
        deletes = len(task.delete_files or ())
        files.append(
            DataFile(
                data.file_path,
                found,
                data.record_count,
                bound(data.lower_bounds, offset),
                bound(data.upper_bounds, offset),
                f"{deletes} delete file(s) apply to it (row-level deletes)" if deletes else None,
            )
        )
    return files
