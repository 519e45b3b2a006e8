"""``liftbridge://`` asset URIs: ``liftbridge://<broker host:port>/<stream>``."""

from __future__ import annotations

from typing import Any
from urllib.parse import SplitResult

from airflow.sdk import Asset

from liftbridge_provider.client.requests import check_stream_name


def sanitize_uri(uri: SplitResult) -> SplitResult:
    """Check a ``liftbridge://host:port/stream`` URI; Airflow calls this for every asset with the scheme."""
    if not uri.netloc:
        raise ValueError(f"liftbridge URI {uri.geturl()!r} must name a broker: liftbridge://host:port/stream")
    stream = uri.path.lstrip("/")
    if not stream or "/" in stream:
        raise ValueError(f"liftbridge URI {uri.geturl()!r} must name exactly one stream: liftbridge://host:port/stream")
    check_stream_name(stream)
    return uri


def create_asset(*, broker: str, stream: str, extra: dict[str, Any] | None = None) -> Asset:
    """The asset for ``stream`` on the cluster reached at ``broker`` (``host:port``)."""
    return Asset(uri=f"liftbridge://{broker}/{check_stream_name(stream)}", extra=extra)
