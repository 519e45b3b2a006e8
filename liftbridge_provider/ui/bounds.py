"""How long the Liftbridge page may wait and how much it reads: the bounds, and the cache that keeps them.

Every answer of the page's API is bounded:

* the cluster's metadata: one FetchMetadata with the connection's
  ``request_timeout`` lowered to :data:`METADATA_TIMEOUT` (5 s); an unreachable
  cluster answers with its error within about that;
* then, concurrently on at most :data:`WORKERS` threads, each ``__cursors``
  partition's last :data:`CURSOR_SCAN_LIMIT` messages and each dead-letter
  partition's last :data:`DEAD_LETTER_SCAN_LIMIT`, each read bounded by
  :data:`READ_TIMEOUT` (5 s) and all of them together by the same time: what
  is not read by then is reported as such, next to what was;
* a connection's snapshot is kept :data:`CACHE_TTL` seconds (5 s), errors too,
  and concurrent requests for one connection share one refresh
  (:class:`TtlCache`), so a page open in many browsers costs the cluster one
  round every 5 s at most.

* the Runs view: the newest :data:`RUNS_LIMIT` ingest runs from the metadata
  DB, and their lakes' records read concurrently within :data:`READ_TIMEOUT`
  (of a Delta or Iceberg table, the metadata and at most
  :data:`STRADDLING_FILE_READS` data files' offset columns per run);
* the lag chart's history: ``history.SAMPLES`` samples per series, at most
  ``history.SERIES`` series, in the API server's memory.

So an answer takes at most ``METADATA_TIMEOUT + READ_TIMEOUT`` (10 s) plus
the metadata DB's queries; the browser gives up after
:data:`BROWSER_TIMEOUT` (20 s) and shows that instead of waiting on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

METADATA_TIMEOUT = 5.0
"""Seconds for the cluster's metadata (one FetchMetadata, retries included)."""
READ_TIMEOUT = 5.0
"""Seconds for every read after the metadata together (``__cursors`` scans, dead letters)."""
CACHE_TTL = 5.0
"""Seconds a connection's snapshot (or its error) is served from the cache."""
CURSOR_SCAN_LIMIT = 20_000
"""Messages read at most per ``__cursors`` partition (its newest ones): a cursor not written within them is
not shown. ``__cursors`` is compacted, so this covers every cursor but on a busy cluster between cleanings."""
DEAD_LETTER_SCAN_LIMIT = 1_000
"""Messages read at most per dead-letter partition (its newest ones), to count them per watcher."""
WORKERS = 8
"""Threads that read concurrently, for every connection and request of the API server together."""
BROWSER_TIMEOUT = 20.0
"""Seconds the page's script waits for an answer before it shows that none came."""
RUNS_LIMIT = 20
"""Ingest runs the Runs view shows (the newest; their lakes' records read within :data:`READ_TIMEOUT`)."""
STRADDLING_FILE_READS = 8
"""Data files of a Delta or Iceberg table whose ``offset`` column the Runs view reads per run at most: files
that hold offsets on both sides of a range's boundary (after an OPTIMIZE or a compaction), counted exactly;
a range that needs more shows its rows as unknown."""
REFRESH_INTERVAL = 5.0
"""Seconds between the page's refreshes while it is open (the cache's TTL: no faster than the cluster is asked)."""


def ui_request_timeout(configured: float) -> float:
    """The ``request_timeout`` of the page's client: the connection's, at most :data:`METADATA_TIMEOUT`."""
    return min(configured, METADATA_TIMEOUT)


T = TypeVar("T")


@dataclass(frozen=True)
class Cached(Generic[T]):
    """A computed value or the error text it failed with, and when (the cache's clock) it was computed."""

    value: T | None
    error: str | None
    at: float


class TtlCache(Generic[T]):
    """Values kept ``ttl`` seconds per key; one computation per key at a time, the others wait for it.

    A computation that raises is kept as its error text for the same time (an unreachable cluster is not asked
    again by every request). ``compute`` is expected to be bounded itself (the page's calls are); the cache
    adds no timeout of its own.

    :param ttl: seconds a value or error is served.
    :param clock: monotonic seconds (``time.monotonic``; tests give their own).
    :param describe: the error text kept for an exception.
    """

    def __init__(
        self,
        *,
        ttl: float = CACHE_TTL,
        clock: Callable[[], float] = time.monotonic,
        describe: Callable[[BaseException], str] = str,
    ) -> None:
        self.ttl = ttl
        self._clock = clock
        self._describe = describe
        self._entries: dict[Hashable, Cached[T]] = {}
        self._locks: dict[Hashable, threading.Lock] = {}
        self._guard = threading.Lock()

    def _fresh(self, key: Hashable) -> Cached[T] | None:
        entry = self._entries.get(key)
        if entry is not None and self._clock() - entry.at < self.ttl:
            return entry
        return None

    def get(self, key: Hashable, compute: Callable[[], T]) -> Cached[T]:
        """The fresh entry of ``key``, or a new one from ``compute()`` (once, however many callers wait)."""
        if (entry := self._fresh(key)) is not None:
            return entry
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if (entry := self._fresh(key)) is not None:
                return entry
            try:
                entry = Cached(compute(), None, self._clock())
            except Exception as exc:  # every failure is shown to the user as text, never raised into the API
                entry = Cached(None, self._describe(exc) or type(exc).__name__, self._clock())
            self._entries[key] = entry
            return entry

    def clear(self) -> None:
        with self._guard:
            self._entries.clear()
