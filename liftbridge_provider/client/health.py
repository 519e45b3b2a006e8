"""What this process knows of each broker's health: the one model every path tells and asks.

Every way the client reaches a broker (unary calls, the shared publish
streams, batch publishing, subscriptions, the asyncio client) tells this
model what it saw, and every choice between brokers asks it, so a broker that
one path found frozen is tried last by all of them:

- :attr:`Signal.SILENT`: a connection or an attempt got no answer within its
  own time, an ack did not come, a write stalled (a frozen node accepts TCP
  and says nothing). The broker goes last for :data:`SUSPECT_FOR` seconds.
- :attr:`Signal.BROKEN`: an established connection or stream broke (the
  broker died or reset it). It goes last for :data:`SUSPECT_FOR` seconds too.
- :attr:`Signal.REFUSED`: it refused a new connection. Nothing was sent, and
  asking again costs next to nothing (the next path reads the channel's live
  state and moves on at once), so it does not change the order.
- :attr:`Signal.ANSWERED`: it answered: whatever it was suspected of is over.

Whether a channel is connected right now is never remembered here: each
path reads the channel's live connectivity state before it sends (a flag
cached from an earlier connection let a publish go to a broker that had died
since). The model is process-wide, keyed by dial address, as a Spark
executor's tasks each open their own client and should not each pay for the
same frozen broker. It holds no I/O; ``clock`` is injectable for tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from enum import Enum

SUSPECT_FOR = 30.0  # seconds a broker that was silent or broke goes last
FAIR_CHANCE = 1.0  # seconds a broker must have had to answer before its silence counts against it


def silence_counts(given: float) -> bool:
    """A broker that did not answer in ``given`` seconds is to be told SILENT: only when it had a fair chance
    (a caller's tiny timeout, not the broker, cut the wait short otherwise)."""
    return given >= FAIR_CHANCE


class Signal(Enum):
    """What a path saw of a broker."""

    ANSWERED = "answered"
    REFUSED = "refused"
    SILENT = "silent"
    BROKEN = "broken"


class BrokerHealth:
    """Suspicions (until when each broker goes last) and first-connection times, by dial address."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._suspect_until: dict[str, float] = {}
        self._connect_seconds: dict[str, float] = {}

    def tell(self, address: str, signal: Signal) -> None:
        """Record what a path saw of ``address``."""
        now = self._clock()
        with self._lock:
            if signal is Signal.ANSWERED:
                self._suspect_until.pop(address, None)
            elif signal is not Signal.REFUSED:
                self._suspect_until[address] = now + SUSPECT_FOR

    def answered(self, address: str) -> None:
        """``tell(address, ANSWERED)``, cheap when nothing was held against it (the publish hot path)."""
        if address in self._suspect_until:
            self.tell(address, Signal.ANSWERED)

    def suspected(self, address: str) -> bool:
        """Whether ``address`` was silent or broke in the last :data:`SUSPECT_FOR` seconds."""
        return self._suspect_until.get(address, 0.0) > self._clock()

    def suspects(self) -> frozenset[str]:
        """Every address suspected now."""
        if not self._suspect_until:  # the usual case, on every publish: no lock needed to see it
            return _NOBODY
        now = self._clock()
        with self._lock:
            return frozenset(a for a, until in self._suspect_until.items() if until > now)

    def suspects_last(self, addresses: Iterable[str]) -> list[str]:
        """``addresses`` in their order, with the suspected ones moved to the end (in their order too)."""
        ordered = list(addresses)
        suspects = self.suspects()
        if not suspects:
            return ordered
        return [a for a in ordered if a not in suspects] + [a for a in ordered if a in suspects]

    def note_connect_time(self, address: str, seconds: float) -> None:
        """The first connection to ``address`` took ``seconds`` (kept: ``broker_selection="latency"``)."""
        self._connect_seconds.setdefault(address, seconds)

    def connect_seconds(self, address: str) -> float | None:
        """How long the first connection to ``address`` took, or None when not measured yet."""
        return self._connect_seconds.get(address)

    def clear(self) -> None:
        """Forget everything (tests start from a clean slate)."""
        with self._lock:
            self._suspect_until.clear()
            self._connect_seconds.clear()


_NOBODY: frozenset[str] = frozenset()

HEALTH = BrokerHealth()
"""The process's model: what every client of this process has seen of each broker."""
