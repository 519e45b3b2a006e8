"""The Liftbridge page's answers, per connection: one cached, bounded, secret-free overview.

:class:`OverviewService` turns a connection id into the JSON the page shows
(``views.py``), from one :func:`~liftbridge_provider.ui.cluster.read_snapshot`
kept ``CACHE_TTL`` seconds (``bounds.TtlCache``). Every error text that leaves
it went through ``views.redact`` with the connection's secrets, and the
connection itself only as ``views.connection_summary``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.connection import config_from_connection
from liftbridge_provider.ui import bounds, cluster, history, views
from liftbridge_provider.ui.airflow_sources import LiftbridgeConnection, connection, liftbridge_connections, watchers_of
from liftbridge_provider.ui.cursor_log import POSITION_KINDS, cursor_kind


class PageError(Exception):
    """A failure the page shows as it is: its text is already free of secrets."""


class OverviewService:
    """Overviews of ``liftbridge`` connections, cached per connection id.

    :param find: the connection of an id (None: no such ``liftbridge`` connection).
    :param list_all: every listable ``liftbridge`` connection.
    :param watchers: the asset watchers on a connection id.
    :param client_for: the client for a connection id and its page configuration.
    :param cache: the cache of overviews (its TTL is the page's).
    :param lag_history: where each overview's cursor lags are kept for the lag chart.
    """

    def __init__(
        self,
        *,
        find: Callable[[str], LiftbridgeConnection | None] = connection,
        list_all: Callable[[], list[LiftbridgeConnection]] = liftbridge_connections,
        watchers: Callable[[str], list[views.WatcherInfo]] = watchers_of,
        client_for: Callable[[str, Any], LiftbridgeClient] | None = None,
        cache: bounds.TtlCache[dict[str, Any]] | None = None,
        lag_history: history.LagHistory | None = None,
    ) -> None:
        self._find = find
        self._list_all = list_all
        self._watchers = watchers
        self._client_for = client_for or _pooled_client
        self._cache = cache if cache is not None else bounds.TtlCache[dict[str, Any]]()
        self.history = lag_history if lag_history is not None else history.LagHistory()

    def connections(self) -> list[dict[str, Any]]:
        """Every listable ``liftbridge`` connection, secret-free (a bad one says why it cannot be used)."""
        rows = []
        for conn in self._list_all():
            rows.append(_summary(conn))
        return rows

    def find(self, conn_id: str) -> LiftbridgeConnection | None:
        return self._find(conn_id)

    def overview(self, conn: LiftbridgeConnection) -> tuple[dict[str, Any] | None, str | None, float]:
        """The connection's overview or the error text that replaced it, and the cached answer's age (s)."""
        entry = self._cache.get(conn.conn_id, lambda: self._look(conn))
        return entry.value, entry.error, max(0.0, time.monotonic() - entry.at)

    def _look(self, conn: LiftbridgeConnection) -> dict[str, Any]:
        secrets = views.secrets_of(conn.password, conn.extra)

        def describe(exc: BaseException) -> str:
            return views.redact(str(exc) or type(exc).__name__, secrets)

        began = time.monotonic()
        try:
            config = cluster.page_config(config_from_connection(conn.host, conn.port, conn.extra))
        except Exception as exc:
            raise PageError(f"the connection cannot be used: {describe(exc)}") from None
        watcher_error = None
        try:
            watchers = self._watchers(conn.conn_id)
        except Exception as exc:  # the DB's failure hides the watchers only
            watchers, watcher_error = [], f"the asset watchers could not be read: {describe(exc)}"
        try:
            client = self._client_for(conn.conn_id, config)
            snapshot = cluster.read_snapshot(
                client, [w.dlq_stream for w in watchers if w.dlq_stream], describe=describe
            )
        except Exception as exc:
            took = time.monotonic() - began
            raise PageError(
                f"Liftbridge at {', '.join(config.brokers)} did not answer within {took:.1f} s: {describe(exc)}"
            ) from None
        watcher_ids = {w.cursor_id for w in watchers}
        records = snapshot.cursors.records.values()
        positions = [r for r in records if cursor_kind(r.cursor_id, watcher_ids) in POSITION_KINDS]
        cursor_rows = views.cursor_rows(positions, snapshot.metadata, watcher_ids)
        self.history.record(conn.conn_id, time.time(), cursor_rows)
        for row in cursor_rows:
            row["chart"] = history.chart(self.history.of(conn.conn_id, row["cursor_id"], row["stream"]))
        return {
            "connection": views.connection_summary(conn.conn_id, config.brokers, conn.extra),
            "fetched_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "elapsed_ms": round(snapshot.elapsed * 1000),
            "brokers": sorted(
                ({"id": b.id, "address": b.address, "leads": b.leader_count, "holds": b.partition_count})
                for b in snapshot.metadata.brokers.values()
            ),
            "streams": views.stream_rows(snapshot.metadata),
            "cursors": {
                "rows": cursor_rows,
                "complete": snapshot.cursors.complete,
                "errors": list(snapshot.cursors.errors),
                "hidden": views.bookkeeping_counts(records, watcher_ids),
            },
            "watchers": {
                "rows": views.watcher_rows(watchers, positions, snapshot.metadata, snapshot.dead_letters),
                "error": watcher_error,
            },
            "bounds": {
                "metadata_timeout_s": bounds.METADATA_TIMEOUT,
                "read_timeout_s": bounds.READ_TIMEOUT,
                "cache_ttl_s": bounds.CACHE_TTL,
                "cursor_scan_limit": bounds.CURSOR_SCAN_LIMIT,
                "dead_letter_scan_limit": bounds.DEAD_LETTER_SCAN_LIMIT,
                "refresh_interval_s": bounds.REFRESH_INTERVAL,
                "browser_timeout_s": bounds.BROWSER_TIMEOUT,
                "history_samples": history.SAMPLES,
                "history_series": history.SERIES,
            },
        }


def _summary(conn: LiftbridgeConnection) -> dict[str, Any]:
    secrets = views.secrets_of(conn.password, conn.extra)
    try:
        brokers = config_from_connection(conn.host, conn.port, conn.extra).brokers
        problem = None
    except Exception as exc:
        brokers, problem = (), views.redact(str(exc), secrets)
    return {**views.connection_summary(conn.conn_id, brokers, conn.extra), "problem": problem}


def _pooled_client(conn_id: str, config: Any) -> LiftbridgeClient:
    from liftbridge_provider.hooks.liftbridge import CLIENTS  # noqa: PLC0415 - the API server's pool of clients

    return CLIENTS.get(f"liftbridge-ui:{conn_id}", config)
