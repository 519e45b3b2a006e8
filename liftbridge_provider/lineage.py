"""Lineage of an ingest: the stream read, the lake written (Airflow's hook lineage, which OpenLineage reads)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from airflow.providers.common.compat.sdk import get_hook_lineage_collector

from liftbridge_provider.hooks.liftbridge import LiftbridgeHook

_SCHEMES = {"s3a": "s3", "s3n": "s3"}  # Hadoop's names for S3, as Airflow's assets name it


def lake_uri(output: str) -> str:
    """The asset URI of an ingest's output: ``file:///abs/path`` for a local path, other URIs as given
    (Hadoop's ``s3a://`` as ``s3://``)."""
    parsed = urlsplit(output)
    if len(parsed.scheme) > 1:  # a URI (a one-letter scheme is a Windows drive)
        scheme = _SCHEMES.get(parsed.scheme, parsed.scheme)
        return parsed._replace(scheme=scheme).geturl()
    return Path(output).resolve().as_uri()


def report_ingest(hook: LiftbridgeHook, stream: str, output: str) -> None:
    """Hook lineage of a task that ingests ``stream`` into the lake at ``output``."""
    hook.report_read(stream)
    get_hook_lineage_collector().add_output_asset(context=hook, uri=lake_uri(output))
