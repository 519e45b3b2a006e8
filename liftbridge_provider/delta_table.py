"""Where a Delta table written by ``ingest.py --format delta`` stands: the offset intervals it holds.

Reads the table's log through delta-rs (the ``deltalake`` package of the
``spark`` extra, imported only when asked); the layout of the ledger and the
decisions are in ``core/delta_plan.py``. A table is a local path or an S3
location (``s3a://`` or ``s3://``, named ``s3://`` to delta-rs): every reader
of an S3 table (the job, the freeze operator's ``start="delta"``) opens it
with the same delta-rs ``storage_options``, made from one
:class:`~liftbridge_provider.core.object_store.S3Settings`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from liftbridge_provider.core.delta_plan import legacy_id, read_holdings
from liftbridge_provider.core.errors import InvalidArgumentError
from liftbridge_provider.core.lake import LakeError
from liftbridge_provider.core.s3_sources import library_uri, s3_location
from liftbridge_provider.core.table_plan import Interval, LedgerError

if TYPE_CHECKING:
    from deltalake import DeltaTable

PARTITION_COLUMN = "partition"  # ingested tables are partitioned by the Liftbridge partition


def table_path(output: str) -> str:
    """Where the Delta table ``output`` names is, as delta-rs names it: the absolute local folder of a plain
    path or a ``file:`` URI, ``s3://bucket/key`` of an ``s3a://``, ``s3://`` or ``s3n://`` URI
    (InvalidArgumentError for any other scheme)."""
    if s3_location(output) is not None:
        return library_uri(output).rstrip("/")
    parsed = urlparse(output)
    if parsed.scheme not in ("", "file"):
        raise InvalidArgumentError(
            f"a Delta table must be a local path (a plain path or a file: URI) or on S3 (s3a://bucket/key), "
            f"got {output!r}"
        )
    return os.path.abspath(parsed.path if parsed.scheme else output)


def require_deltalake() -> None:
    """Fail clearly (InvalidArgumentError) when the ``deltalake`` package is missing."""
    try:
        import deltalake  # noqa: F401, PLC0415 - optional dependency
    except ImportError as exc:
        raise InvalidArgumentError(
            "Delta tables need the deltalake package (pip install 'liftbridge-provider[spark]')"
        ) from exc


def holdings(table: DeltaTable, stream: str, partitions: Iterable[int]) -> dict[int, list[Interval]]:
    """The offset intervals ``table`` holds of each of ``stream``'s ``partitions`` (LakeError: not a ledger)."""
    lowest: dict[int, int] | None = None

    def lowest_offset(partition: int) -> int | None:  # asked only for a table of the earlier layout
        nonlocal lowest
        if lowest is None:
            lowest = _lowest_offsets(table)
        return lowest.get(partition)

    found = {}
    for partition in partitions:
        try:
            found[partition] = read_holdings(
                stream, partition, table.transaction_version, partial(lowest_offset, partition)
            )
        except LedgerError as exc:
            raise LakeError(f"the Delta table {table.table_uri}: {exc}") from exc
    return found


def _lowest_offsets(table: DeltaTable) -> dict[int, int]:
    """The smallest offset in each partition's files, from the log's file statistics."""
    import pyarrow as pa  # noqa: PLC0415 - with deltalake, optional

    actions = pa.table(table.get_add_actions(flatten=True))
    column = f"partition.{PARTITION_COLUMN}"
    lowest: dict[int, int] = {}
    if "min.offset" not in actions.column_names or column not in actions.column_names:
        return lowest
    for row in actions.select([column, "min.offset"]).to_pylist():
        if row[column] is not None and row["min.offset"] is not None:
            partition, low = int(row[column]), int(row["min.offset"])
            lowest[partition] = min(low, lowest.get(partition, low))
    return lowest


def table_offsets(
    table: str, stream: str, partitions: Iterable[int], storage_options: Mapping[str, str] | None = None
) -> dict[int, int]:
    """``{partition: next offset}``: the end of the highest interval the table holds of each partition of
    ``stream`` (partitions never written are left out; no table yet: ``{}``). ``storage_options``: delta-rs's,
    for a table on S3 (``S3Settings.delta_storage_options()``)."""
    require_deltalake()
    from deltalake import DeltaTable  # noqa: PLC0415 - optional dependency
    from deltalake.exceptions import TableNotFoundError  # noqa: PLC0415

    try:
        delta = DeltaTable(table_path(table), storage_options=dict(storage_options or {}) or None)
    except TableNotFoundError:
        return {}
    wanted = list(partitions)
    held = holdings(delta, stream, wanted)
    offsets = {}
    for partition in wanted:
        legacy = delta.transaction_version(legacy_id(stream, partition))
        ends = [end for _, end in held[partition]] + ([legacy] if legacy is not None else [])
        if ends:
            offsets[partition] = max(ends)
    return offsets
