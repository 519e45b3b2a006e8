"""Stand-ins for ``airflow.triggers.shared_stream`` (Airflow 3.3+) where Airflow has no shared streams.

Same names and shapes, so the watcher readers are defined the same way on
every Airflow; before 3.3 no triggerer drives them as shared streams: the
watchers run one trigger at a time (:mod:`liftbridge_provider.triggers.handover`).
Imported through :mod:`liftbridge_provider.version_compat`, never directly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple


@dataclass(frozen=True, slots=True)
class AdvanceOutcome:
    """How the watchers resolved one event: ``acked`` (stored), ``failed`` (not stored), ``rejected`` (refused)."""

    acked: int
    failed: int
    rejected: int = 0

    @property
    def is_clean(self) -> bool:
        """Stored by at least one watcher, failed and refused by none."""
        return self.failed == 0 and self.rejected == 0 and self.acked > 0


class AdvanceItem(NamedTuple):
    """One resolved event: what the reader yielded with it, and its outcome."""

    broker_payload: Any
    outcome: AdvanceOutcome


class SharedStreamProducer(ABC):
    """The reader side of a shared stream: yields ``(raw event, broker payload)``, advances resolved events."""

    @abstractmethod
    def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """Yield ``(raw event, broker payload)`` pairs, for ever or until an error."""

    @abstractmethod
    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Move past a lane's resolved events."""

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        """Events of one lane are advanced in order (default: one lane)."""
        return None

    async def aclose(self) -> None:  # noqa: B027 - optional, as in Airflow's class
        """Release the reader's resources."""


def reject_shared_stream_event() -> None:
    """Refuse the event being filtered: only meaningful inside a shared stream, which this Airflow lacks."""
    raise RuntimeError("reject_shared_stream_event() needs Airflow 3.3+ shared streams")
