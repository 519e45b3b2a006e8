"""The table formats of the ingest job's ``--format delta`` and ``--format iceberg``, from its arguments.

Kept apart from ``spark/ingest.py`` so that the job imports deltalake and pyiceberg only for the format it
writes (each is an optional dependency, refused clearly when missing).
"""

from __future__ import annotations

import argparse
from typing import Any

from liftbridge_provider.core.errors import InvalidArgumentError
from liftbridge_provider.core.iceberg_plan import table_identifier
from liftbridge_provider.core.object_store import S3Settings
from liftbridge_provider.delta_table import require_deltalake, table_path


def delta_format(args: argparse.Namespace, settings: S3Settings | None) -> Any:
    """The Delta table of ``--output`` (``settings``: S3's, for a table on S3)."""
    require_deltalake()
    from liftbridge_provider.spark.delta_ingest import DeltaFormat  # noqa: PLC0415 - needs deltalake

    return DeltaFormat(table_path(args.output), settings)


def iceberg_format(args: argparse.Namespace, stream: str, settings: S3Settings | None = None) -> Any:
    """The Iceberg table of ``--iceberg-*`` (``settings``: S3's, for a warehouse on S3; InvalidArgumentError for
    a malformed property or name, or a warehouse on S3 without a catalog)."""
    require_pyiceberg()
    from pyiceberg.utils.config import Config  # noqa: PLC0415 - optional dependency

    from liftbridge_provider.spark.iceberg_ingest import IcebergFormat, catalog_properties  # noqa: PLC0415 - pyiceberg

    given = {}
    for item in args.iceberg_catalog_property:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidArgumentError(f"--iceberg-catalog-property must be KEY=VALUE, got {item!r}")
        given[key] = value
    configured = Config().get_catalog_config(args.iceberg_catalog) or {}
    properties = catalog_properties(args.output, given, settings, {k: str(v) for k, v in configured.items()})
    return IcebergFormat(args.iceberg_catalog, properties, table_identifier(stream, args.iceberg_table))


def require_pyiceberg() -> None:
    """Fail clearly (InvalidArgumentError) when the ``pyiceberg`` package is missing."""
    try:
        import pyiceberg  # noqa: F401, PLC0415 - optional dependency
    except ImportError as exc:
        raise InvalidArgumentError(
            "Iceberg tables need the pyiceberg package (pip install 'airflow-provider-liftbridge[iceberg]')"
        ) from exc
