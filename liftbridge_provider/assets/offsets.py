"""The offsets a task read from a stream, as it travels from hook lineage to OpenLineage.

A task that reads a stream reports it to Airflow's hook lineage with the exact
half-open ranges ``[start, end)`` per partition in the asset's ``extra``, under
:data:`FACET_NAME`. The ``liftbridge://`` converter (``assets/liftbridge.py``)
turns that entry into the custom dataset facet of the same name
(``assets/offsets_facet.py``), so an OpenLineage consumer can trace what a task
wrote back to the offsets it was made of. No Airflow or OpenLineage import here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from liftbridge_provider import __version__
from liftbridge_provider.core.ranges import OffsetRange

FACET_NAME = "liftbridge_offsets"  # key in the asset's extra and in the OpenLineage dataset's facets
FACET_VERSION = "1-0-0"  # the schema version in SCHEMA_URL; a change of fields gets a new one
# Where the facet's JSON schema is published; the same schema ships in the package (SCHEMA_FILE).
SCHEMA_URL = (
    "https://liftbridge-provider.github.io/spec/facets/"
    f"{FACET_VERSION}/LiftbridgeOffsetsDatasetFacet.json#/$defs/LiftbridgeOffsetsDatasetFacet"
)
SCHEMA_FILE = "facets/LiftbridgeOffsetsDatasetFacet.json"  # beside this module
PRODUCER = f"https://pypi.org/project/airflow-provider-liftbridge/{__version__}/"  # the facet's _producer


def offsets_extra(stream: str, ranges: Iterable[OffsetRange], cursor_id: str | None) -> dict[str, Any]:
    """The asset ``extra`` that carries ``ranges`` of ``stream`` (sorted by partition, empty ones kept: the
    task looked at that partition and found nothing to read) and the cursor they started from, if any."""
    return {
        FACET_NAME: {
            "stream": stream,
            "cursor_id": cursor_id,
            "ranges": [r.to_json() for r in sorted(ranges)],
        }
    }


def offsets_in(extra: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The offsets entry of an asset's ``extra``, or None when it holds none or a malformed one (an asset
    made elsewhere may carry anything: it is then converted without the facet)."""
    entry = (extra or {}).get(FACET_NAME)
    if not isinstance(entry, Mapping) or not isinstance(entry.get("stream"), str):
        return None
    ranges = entry.get("ranges")
    if not isinstance(ranges, list) or not all(_is_range(r) for r in ranges):
        return None
    cursor_id = entry.get("cursor_id")
    if cursor_id is not None and not isinstance(cursor_id, str):
        return None
    return {"stream": entry["stream"], "cursor_id": cursor_id, "ranges": ranges}


def _is_range(value: Any) -> bool:
    if not isinstance(value, Mapping):
        return False
    numbers = [value.get(k) for k in ("partition", "start", "end")]
    whole = [n for n in numbers if isinstance(n, int) and not isinstance(n, bool) and n >= 0]
    return len(whole) == 3 and whole[1] <= whole[2]
