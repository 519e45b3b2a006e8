"""What watchers report to Airflow's metrics (names and forms in :mod:`liftbridge_provider.metrics`)."""

from __future__ import annotations

from liftbridge_provider import metrics
from liftbridge_provider.metrics import DEAD_LETTERED, WATCHER_LAG
from liftbridge_provider.watching import WatchSettings


def report_lag(settings: WatchSettings, partition: int, lag: int) -> None:
    """Set the lag gauge of one watched partition (offsets)."""
    metrics.gauge(WATCHER_LAG, lag, stream=settings.stream, partition=partition, cursor_id=settings.cursor)


def count_dead_letter(settings: WatchSettings, partition: int) -> None:
    """Count one message published to the dead-letter stream."""
    metrics.count(DEAD_LETTERED, stream=settings.stream, partition=partition, cursor_id=settings.cursor)
