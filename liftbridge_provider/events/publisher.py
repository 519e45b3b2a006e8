"""EventPublisher: a bounded queue of events and one background thread that publishes them, in order.

It exists so that Airflow's listener hooks, which run on the scheduler's loop
and in a task's own process, never wait on Liftbridge: :meth:`EventPublisher.offer`
only appends to a bounded queue (or drops the event when the queue is full)
and returns. One daemon thread per process takes the events in order and
publishes each to the partition its key picks (CRC-32 of the key, as
go-liftbridge), waiting for its ack before the next, so events of one key reach
one partition in the order they were offered. Every publish is bounded by
``publish_timeout``; a failed one is dropped, and the thread rests
``retry_interval`` before the next, so a dead cluster costs one failed publish
per rest, not one per event. :meth:`EventPublisher.drain` lets a stopping
process wait, at most its timeout, for what it queued; what is still queued
then is dropped. Every drop is counted through ``on_drop(reason, count)`` and
logged (the first of a reason at once, then at most one line per
:data:`LOG_INTERVAL` with the count). After ``os.fork`` the child starts with an
empty queue, no thread and no connection of its own (the parent's are not
usable there). No Airflow import: the caller hands in how to connect and how
to count.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

LOG_INTERVAL = 60.0  # seconds between two log lines about drops of one reason (the first one is logged at once)

QUEUE_FULL = "queue_full"  # drop reasons, as counted and logged
PUBLISH_FAILED = "publish_failed"
STOPPING = "stopping"


class Sender(Protocol):
    """What the publisher needs of a Liftbridge client."""

    def publish(
        self, stream: str, value: bytes, *, key: bytes | None = ..., partitioner: Any = ..., timeout: float | None = ...
    ) -> object:
        """Publish one message to the partition ``partitioner`` picks and wait for its ack (``timeout`` s)."""

    def close(self) -> None:
        """Close the connections."""


@dataclass(frozen=True)
class _Item:
    key: bytes
    value: bytes
    not_before: float  # monotonic seconds: not published before this time (unless draining)


class _DropLog:
    """Drops, counted per reason; logs the first of a reason at once and then at most once per LOG_INTERVAL."""

    def __init__(self, on_drop: Callable[[str, int], None], stream: str) -> None:
        self._on_drop = on_drop
        self._stream = stream
        self._lock = threading.Lock()
        self.totals: dict[str, int] = {}
        self._unlogged: dict[str, int] = {}
        self._logged_at: dict[str, float] = {}

    def add(self, reason: str, count: int, why: str) -> None:
        if count <= 0:
            return
        try:
            self._on_drop(reason, count)
        except Exception:  # a metrics backend that fails must not stop the publisher
            log.debug("counting dropped events failed", exc_info=True)
        now = time.monotonic()
        with self._lock:
            self.totals[reason] = self.totals.get(reason, 0) + count
            pending = self._unlogged.get(reason, 0) + count
            last = self._logged_at.get(reason)
            if last is not None and now - last < LOG_INTERVAL:
                self._unlogged[reason] = pending
                return
            self._unlogged[reason] = 0
            self._logged_at[reason] = now
        log.warning(
            "Liftbridge event listener: dropped %d event(s) for stream %r (%s): %s", pending, self._stream, reason, why
        )


class EventPublisher:
    """Publishes events to ``stream`` from a background thread, never blocking the caller.

    :param connect: returns the client to publish with; called on the publishing
        thread at its first event (and again after a failed connect).
    :param stream: the stream every event goes to.
    :param queue_size: events held at most; an event offered to a full queue is dropped.
    :param publish_timeout: seconds one publish may wait for its ack.
    :param retry_interval: seconds the thread rests after a failed publish.
    :param on_drop: called with ``(reason, count)`` for every drop: ``queue_full``,
        ``publish_failed`` or ``stopping``.
    """

    def __init__(
        self,
        *,
        connect: Callable[[], Sender],
        stream: str,
        queue_size: int,
        publish_timeout: float,
        retry_interval: float,
        on_drop: Callable[[str, int], None],
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size!r}")
        if not publish_timeout > 0 or retry_interval < 0:
            raise ValueError(f"publish_timeout must be > 0 and retry_interval >= 0, got {publish_timeout!r}, "
                             f"{retry_interval!r}")  # fmt: skip
        self._connect = connect
        self._stream = stream
        self._queue_size = queue_size
        self._publish_timeout = publish_timeout
        self._retry_interval = retry_interval
        self._on_drop = on_drop
        self._reset()
        method = weakref.WeakMethod(self._reset)
        os.register_at_fork(after_in_child=lambda: (reset := method()) is not None and reset())

    def _reset(self) -> None:
        """A fresh state: at construction, and in a forked child (whose copies of the lock, the thread and the
        connection are the parent's, unusable here; the parent's queued events are the parent's to publish)."""
        self._drops = _DropLog(self._on_drop, self._stream)
        self._cond = threading.Condition()
        self._items: deque[_Item] = deque()
        self._thread: threading.Thread | None = None
        self._sender: Sender | None = None
        self._in_flight = False
        self._abandoned = False  # the publish under way was counted as dropped by a drain that gave up on it
        self._rest_until = 0.0
        self._draining = 0
        self._closed = False
        self.published = 0

    @property
    def dropped(self) -> dict[str, int]:
        """Events dropped so far in this process, per reason."""
        return dict(self._drops.totals)

    def offer(self, key: bytes, value: bytes, *, delay: float = 0.0) -> bool:
        """Queue an event (published no sooner than ``delay`` seconds from now); False if it was dropped
        because the queue is full or the publisher is closed. Never waits for Liftbridge."""
        with self._cond:
            if self._closed or len(self._items) >= self._queue_size:
                full = not self._closed
            else:
                self._items.append(_Item(key, value, time.monotonic() + delay))
                self._start()
                self._cond.notify_all()
                return True
        why = f"the queue holds {self._queue_size} events (queue_size)" if full else "the publisher is closed"
        self._drops.add(QUEUE_FULL if full else STOPPING, 1, why)
        return False

    def drain(self, timeout: float) -> int:
        """Publish what is queued now, at once (no delay, no rest), waiting at most ``timeout`` seconds; drop
        what is still queued then (``stopping``) and return how many that was. A publish still under way then
        goes on in the background but is counted as dropped too (the process may end before it does; should
        it succeed after all, it was both published and counted)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._draining += 1
            self._cond.notify_all()
            try:
                while self._items or self._in_flight:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._thread is None or not self._thread.is_alive():
                        break
                    self._cond.wait(left)
                leftover = len(self._items) + (1 if self._in_flight and not self._abandoned else 0)
                self._abandoned = self._in_flight
                self._items.clear()
            finally:
                self._draining -= 1
        self._drops.add(STOPPING, leftover, f"not published within {timeout:g}s of stopping (flush_timeout)")
        return leftover

    def close(self, timeout: float) -> None:
        """Drain (at most ``timeout`` seconds), stop the thread and close the connection."""
        self.drain(timeout)
        with self._cond:
            self._closed = True
            sender, self._sender = self._sender, None
            self._cond.notify_all()
        if sender is not None:
            try:
                sender.close()
            except Exception:
                log.debug("closing the event publisher's client failed", exc_info=True)

    def _start(self) -> None:
        """Start the publishing thread if it is not running (caller holds the lock)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="liftbridge-events", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            while (item := self._next()) is not None:
                failed = self._send(item)
                with self._cond:
                    self._in_flight = self._abandoned = False
                    if failed:
                        self._rest_until = time.monotonic() + self._retry_interval
                    self._cond.notify_all()
        except BaseException:  # never seen; logged so a dead thread is not silent (the next offer starts one)
            log.exception("Liftbridge event listener: the publishing thread stopped")
            with self._cond:
                self._in_flight = False
                self._cond.notify_all()

    def _next(self) -> _Item | None:
        """The next event once it is due (its delay and any rest over, or a drain asks for it); None on close."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                if self._items:
                    due = max(self._items[0].not_before, self._rest_until)
                    wait = due - time.monotonic()
                    if self._draining or wait <= 0:
                        self._in_flight = True
                        return self._items.popleft()
                    self._cond.wait(wait)
                else:
                    self._cond.wait()

    def _send(self, item: _Item) -> bool:
        """Publish one event; True if it failed (then it was dropped and counted)."""
        try:
            sender = self._sender
            if sender is None:
                sender = self._sender = self._connect()
            sender.publish(self._stream, item.value, key=item.key, partitioner="key", timeout=self._publish_timeout)
        except Exception as exc:
            with self._cond:
                counted = self._abandoned
            if not counted:
                self._drops.add(PUBLISH_FAILED, 1, f"{type(exc).__name__}: {exc}")
            return True
        self.published += 1
        return False
