"""What the provider reports to Airflow's metrics (StatsD, OpenTelemetry or Datadog, as Airflow is configured).

Each figure is sent twice: under its plain name with ``stream``, ``partition`` and
``cursor_id`` tags (for backends with tags), and with those three in the name,
``<name>.<cursor_id>.<stream>.<partition>`` (for plain StatsD, which drops tags).
"""

from __future__ import annotations

import re

from airflow.providers.common.compat.sdk import Stats

CURSOR_LAG = "liftbridge.cursor_lag"  # gauge: offsets between a cursor and the high watermark (operators, sensors)
WATCHER_LAG = "liftbridge.watcher.lag"  # gauge: offsets between a watcher's stored position and the high watermark
DEAD_LETTERED = "liftbridge.watcher.dead_lettered"  # counter: messages published to a dead-letter stream


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
