"""Lineage of an ingest: the stream read, the lake written (Airflow's hook lineage, which OpenLineage reads)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from airflow.providers.common.compat.sdk import get_hook_lineage_collector

from liftbridge_provider.client import InvalidArgumentError
from liftbridge_provider.hooks.liftbridge import LiftbridgeHook
from liftbridge_provider.ranges import RangesDocument

_SCHEMES = {"s3a": "s3", "s3n": "s3"}  # Hadoop's names for S3, as Airflow's assets name it


def lake_uri(output: str) -> str:
    """The asset URI of an ingest's output: ``file:///abs/path`` for a local path, other URIs as given
    (Hadoop's ``s3a://`` as ``s3://``)."""
    parsed = urlsplit(output)
    if len(parsed.scheme) > 1:  # a URI (a one-letter scheme is a Windows drive)
        scheme = _SCHEMES.get(parsed.scheme, parsed.scheme)
        return parsed._replace(scheme=scheme).geturl()
    return Path(output).resolve().as_uri()


def report_ingest(
    hook: LiftbridgeHook,
    stream: str,
    output: str,
    *,
    ranges: RangesDocument | Mapping[str, Any] | str | None = None,
) -> None:
    """Hook lineage of a task that ingests ``stream`` into the lake at ``output``.

    With ``ranges`` (the ranges document the ingest job is given, e.g. the freeze
    task's XCom) the stream's asset carries those offsets, which OpenLineage gets
    as the ``liftbridge_offsets`` dataset facet: the offsets the lake holds for
    this run once the job succeeded. A document of another stream is refused.
    """
    if ranges is None:
        hook.report_read(stream)
    else:
        document = RangesDocument.parse(ranges)
        if document.stream != stream:
            raise InvalidArgumentError(f"the ranges are of stream {document.stream!r}, not {stream!r}")
        hook.report_read(stream, ranges=document.ranges, cursor_id=document.cursor_id)
    get_hook_lineage_collector().add_output_asset(context=hook, uri=lake_uri(output))
