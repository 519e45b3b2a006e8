"""``liftbridge://`` asset URIs: ``liftbridge://<broker host:port>/<stream>``, and their OpenLineage form.

OpenLineage names a stream as it names a Kafka topic (``kafka://host:port`` +
topic): namespace ``liftbridge://<host:port>`` of a broker of the cluster,
name the stream. The provider's hooks use the connection's first broker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, urlsplit

from airflow.sdk import Asset

if TYPE_CHECKING:
    from openlineage.client.event_v2 import Dataset

from liftbridge_provider.assets.offsets import FACET_NAME
from liftbridge_provider.core.checks import check_stream_name


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
    return Asset(uri=stream_uri(broker, stream), extra=extra)


def stream_uri(broker: str, stream: str) -> str:
    """``liftbridge://<broker>/<stream>``."""
    return f"liftbridge://{broker}/{check_stream_name(stream)}"


def convert_asset_to_openlineage(asset: Asset, lineage_context: Any) -> Dataset:
    """The OpenLineage dataset of a ``liftbridge://host:port/stream`` asset: namespace
    ``liftbridge://host:port``, name ``stream`` (the OpenLineage provider calls this). When the asset's
    extra carries the offsets a task read (``assets/offsets.py``), the dataset has them as the
    ``liftbridge_offsets`` facet."""
    from openlineage.client.event_v2 import Dataset  # noqa: PLC0415 - only with the OpenLineage provider

    from liftbridge_provider.assets.offsets_facet import facet_from_extra  # noqa: PLC0415 - likewise

    parsed = urlsplit(asset.uri)
    facet = facet_from_extra(asset.extra)
    facets: dict[str, Any] = {} if facet is None else {FACET_NAME: facet}
    return Dataset(namespace=f"liftbridge://{parsed.netloc}", name=parsed.path.lstrip("/"), facets=facets)
