"""``liftbridge_offsets``: a custom OpenLineage dataset facet with the offsets a task read from a stream.

It follows OpenLineage's conventions for custom facets: a subclass of the
client's ``DatasetFacet`` (so ``_producer`` and ``_schemaURL`` are filled in),
a key prefixed with the producer's name (``liftbridge_``), camelCase fields,
and a JSON schema of its own (``facets/LiftbridgeOffsetsDatasetFacet.json``,
published at :data:`~liftbridge_provider.assets.offsets.SCHEMA_URL`). Imported
only where OpenLineage is installed (by the ``liftbridge://`` converter).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attr
from openlineage.client.generated.base import DatasetFacet
from openlineage.client.utils import RedactMixin

from liftbridge_provider.assets.offsets import PRODUCER, SCHEMA_URL, offsets_in


@attr.define
class LiftbridgeOffsetRange(RedactMixin):
    """Offsets ``start <= offset < end`` of one partition (half-open; empty when ``start == end``)."""

    partition: int
    start: int
    end: int

    _skip_redact: ClassVar[list[str]] = ["partition", "start", "end"]

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA_URL.replace("/LiftbridgeOffsetsDatasetFacet", "/LiftbridgeOffsetRange")


@attr.define
class LiftbridgeOffsetsDatasetFacet(DatasetFacet):
    """The offsets of ``stream`` a task read: one range per partition it looked at, and the cursor
    (``cursorId``) the ranges start after, when they were frozen from one."""

    stream: str
    ranges: list[LiftbridgeOffsetRange]
    cursorId: str | None = None

    _additional_skip_redact: ClassVar[list[str]] = ["stream", "ranges", "cursorId"]

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA_URL


def facet_from_extra(extra: Mapping[str, Any] | None) -> LiftbridgeOffsetsDatasetFacet | None:
    """The facet of the offsets an asset's ``extra`` carries (see ``assets/offsets.py``), or None."""
    entry = offsets_in(extra)
    if entry is None:
        return None
    ranges = [LiftbridgeOffsetRange(r["partition"], r["start"], r["end"]) for r in entry["ranges"]]
    return LiftbridgeOffsetsDatasetFacet(
        stream=entry["stream"], ranges=ranges, cursorId=entry["cursor_id"], producer=PRODUCER
    )
