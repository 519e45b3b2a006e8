"""What watchers report to Airflow's metrics (StatsD, OpenTelemetry or Datadog, as the triggerer is configured).

Each figure is sent twice: under its plain name with ``stream``, ``partition`` and
``cursor_id`` tags (for backends with tags), and with those three in the name,
``<name>.<cursor_id>.<stream>.<partition>`` (for plain StatsD, which drops tags).
"""

from __future__ import annotations

from airflow.sdk.observability.stats import Stats, normalize_name_for_stats

from liftbridge_provider.watching import WatchSettings

LAG = "liftbridge.watcher.lag"  # gauge: offsets between the stored position and the high watermark
DEAD_LETTERED = "liftbridge.watcher.dead_lettered"  # counter: messages published to the dead-letter stream


def _named(stat: str, settings: WatchSettings, partition: int) -> tuple[str, dict[str, str]]:
    tags = {"stream": settings.stream, "partition": str(partition), "cursor_id": settings.cursor}
    name = normalize_name_for_stats(f"{stat}.{settings.cursor}.{settings.stream}.{partition}", log_warning=False)
    return name, tags


def report_lag(settings: WatchSettings, partition: int, lag: int) -> None:
    """Set the lag gauge of one watched partition (offsets)."""
    name, tags = _named(LAG, settings, partition)
    Stats.gauge(LAG, lag, tags=tags)
    Stats.gauge(name, lag)


def count_dead_letter(settings: WatchSettings, partition: int) -> None:
    """Count one message published to the dead-letter stream."""
    name, tags = _named(DEAD_LETTERED, settings, partition)
    Stats.incr(DEAD_LETTERED, tags=tags)
    Stats.incr(name)
