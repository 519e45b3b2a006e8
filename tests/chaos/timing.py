"""Every client and operator call of a seed runs through :class:`CallTimer`: timed against its deadline.

A call runs on a daemon thread; the caller waits for it until its deadline
plus ``grace`` (1 s) and then a little longer (``observe``) to learn how late
it is. A call that is still running then is declared hung and left behind
(its thread is a daemon; the seed ends and the cluster is stopped under it).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

GRACE = 1.0  # seconds a call may outlive its deadline
OBSERVE = 10.0  # seconds to keep waiting for a late call before declaring it hung


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """What a timed call gave: a value or an error, and how long it took (seconds)."""

    name: str
    deadline: float
    seconds: float
    value: T | None = None
    error: BaseException | None = None
    hung: bool = False
    grace: float = GRACE

    @property
    def ok(self) -> bool:
        return self.error is None and not self.hung

    @property
    def late(self) -> bool:
        """Outlived its deadline by more than the grace (hung calls are late too)."""
        return self.hung or self.seconds > self.deadline + self.grace

    def describe(self) -> str:
        if self.hung:
            return f"{self.name}: still running {self.seconds:.1f}s after it started (deadline {self.deadline:g}s)"
        result = "ok" if self.error is None else f"{type(self.error).__name__}: {_short(self.error)}"
        return f"{self.name}: {result} in {self.seconds:.2f}s (deadline {self.deadline:g}s)"


def _short(error: BaseException, limit: int = 300) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class CallTimer:
    """Runs calls with deadlines; keeps the late ones and the seconds spent per kind of call."""

    grace: float = GRACE
    observe: float = OBSERVE
    late: list[Outcome[object]] = field(default_factory=list)
    seconds_by_kind: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def call(self, name: str, deadline: float, function: Callable[[], T]) -> Outcome[T]:
        """Run ``function`` on a daemon thread; ``name`` is "kind detail" (the kind is its first word)."""
        box: dict[str, object] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["value"] = function()
            except BaseException as exc:
                box["error"] = exc
            finally:
                done.set()

        started = time.monotonic()
        threading.Thread(target=target, name=f"chaos-{name.split(maxsplit=1)[0]}", daemon=True).start()
        finished = done.wait(deadline + self.grace + self.observe)
        seconds = time.monotonic() - started
        outcome: Outcome[T] = Outcome(
            name,
            deadline,
            seconds,
            value=box.get("value"),  # type: ignore[arg-type]
            error=box.get("error"),  # type: ignore[arg-type]
            hung=not finished,
            grace=self.grace,
        )
        self.seconds_by_kind[name.split(maxsplit=1)[0]].append(seconds)
        if outcome.late:
            self.late.append(outcome)  # type: ignore[arg-type]
        return outcome
