"""What the provider tells Airflow about its work: metrics (StatsD, OpenTelemetry or Datadog, as Airflow is
configured) and hook lineage (which OpenLineage reads).

Metrics: each per-partition figure is sent twice, under its plain name with
``stream``, ``partition`` and ``cursor_id`` tags (for backends with tags), and
with those three in the name, ``<name>.<cursor_id>.<stream>.<partition>`` (for
plain StatsD, which drops tags). Counters by reason (the event listener's
drops) go out tagged ``reason`` and as ``<name>.<reason>``. Operators and
sensors send the cursor lag, watchers their lag and dead letters, the event
listener its drops.

Lineage: :func:`report_ingest` reports an ingest's stream in (with the offsets
it reads, as the ``liftbridge_offsets`` facet) and its lake out; the hook
itself reports the streams a task reads or writes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow.providers.common.compat.sdk import Stats, get_hook_lineage_collector

from liftbridge_provider.core.errors import InvalidArgumentError
from liftbridge_provider.core.ranges import RangesDocument
from liftbridge_provider.core.watching import WatchSettings

if TYPE_CHECKING:  # the metrics part stays light: the event listener loads it in every Airflow process
    from liftbridge_provider.hooks.liftbridge import LiftbridgeHook

CURSOR_LAG = "liftbridge.cursor_lag"  # gauge: offsets between a cursor and the high watermark (operators, sensors)
WATCHER_LAG = "liftbridge.watcher.lag"  # gauge: offsets between a watcher's stored position and the high watermark
DEAD_LETTERED = "liftbridge.watcher.dead_lettered"  # counter: messages published to a dead-letter stream
EVENTS_DROPPED = "liftbridge.events.dropped"  # counter: Airflow events the event listener did not publish


_INVALID_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_.-]")  # what Airflow's stats names may not hold


def stat_name(name: str) -> str:
    """``name`` with every character a stats name may not hold (not ASCII letter, digit, ``_.-``) as ``_``."""
    return _INVALID_NAME_CHARS.sub("_", name)


def _named(stat: str, stream: str, partition: int, cursor_id: str) -> tuple[str, dict[str, str]]:
    tags = {"stream": stream, "partition": str(partition), "cursor_id": cursor_id}
    name = stat_name(f"{stat}.{cursor_id}.{stream}.{partition}")
    return name, tags


def gauge(stat: str, value: int, *, stream: str, partition: int, cursor_id: str) -> None:
    """Set the gauge ``stat`` of one partition and cursor."""
    name, tags = _named(stat, stream, partition, cursor_id)
    Stats.gauge(stat, value, tags=tags)
    Stats.gauge(name, value)


def count(stat: str, *, stream: str, partition: int, cursor_id: str) -> None:
    """Add one to the counter ``stat`` of one partition and cursor."""
    name, tags = _named(stat, stream, partition, cursor_id)
    Stats.incr(stat, tags=tags)
    Stats.incr(name)


def cursor_lag(high_watermark: int, cursor: int) -> int:
    """Offsets a cursor (the last offset processed, -1: none) is behind the high watermark (-1: empty): >= 0."""
    return max(0, high_watermark - cursor)


def count_by_reason(stat: str, count: int, *, reason: str) -> None:
    """Add ``count`` to the counter ``stat`` for ``reason``: tagged ``reason``, and as ``<stat>.<reason>``."""
    Stats.incr(stat, count, tags={"reason": reason})
    Stats.incr(f"{stat}.{reason}", count)


def report_watcher_lag(settings: WatchSettings, partition: int, lag: int) -> None:
    """Set the lag gauge of one watched partition (offsets)."""
    gauge(WATCHER_LAG, lag, stream=settings.stream, partition=partition, cursor_id=settings.cursor)


def count_dead_letter(settings: WatchSettings, partition: int) -> None:
    """Count one message a watcher published to its dead-letter stream."""
    count(DEAD_LETTERED, stream=settings.stream, partition=partition, cursor_id=settings.cursor)


# -- lineage ---------------------------------------------------------------------


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
