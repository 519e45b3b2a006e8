"""Where a Delta table written by ``ingest.py --format delta`` stands: each partition's next offset.

Needs the ``deltalake`` package (the ``spark`` extra); imported only when asked.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from urllib.parse import urlparse

from liftbridge_provider.client.errors import InvalidArgumentError
from liftbridge_provider.delta_plan import app_id


def table_path(output: str) -> str:
    """The local folder of the Delta table ``output`` names (plain path or ``file:`` URI)."""
    parsed = urlparse(output)
    if parsed.scheme not in ("", "file"):
        raise InvalidArgumentError(f"a Delta table must be a local path (a plain path or a file: URI), got {output!r}")
    return os.path.abspath(parsed.path if parsed.scheme else output)


def require_deltalake() -> None:
    """Fail clearly (InvalidArgumentError) when the ``deltalake`` package is missing."""
    try:
        import deltalake  # noqa: F401, PLC0415 - optional dependency
    except ImportError as exc:
        raise InvalidArgumentError(
            "Delta tables need the deltalake package (pip install 'liftbridge-provider[spark]')"
        ) from exc


def table_offsets(table: str, stream: str, partitions: Iterable[int]) -> dict[int, int]:
    """``{partition: next offset}`` the table holds for ``stream`` (partitions never written are left out;
    no table yet: ``{}``)."""
    require_deltalake()
    from deltalake import DeltaTable  # noqa: PLC0415 - optional dependency
    from deltalake.exceptions import TableNotFoundError  # noqa: PLC0415

    try:
        delta = DeltaTable(table_path(table))
    except TableNotFoundError:
        return {}
    held = {p: delta.transaction_version(app_id(stream, p)) for p in partitions}
    return {p: offset for p, offset in held.items() if offset is not None}
