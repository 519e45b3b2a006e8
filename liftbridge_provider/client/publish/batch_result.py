"""What ``publish_batch`` returns: the acks in input order and the failures, each saying whether it may be stored.

:class:`PublishWindow` (``publish_window.py``) and the publishers build them;
callers read them (``BatchResult``, ``BatchPublishError``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

from liftbridge_provider.client.messages import Ack
from liftbridge_provider.core.errors import LiftbridgeError


@dataclass(frozen=True)
class PublishFailure:
    """Message ``index`` of a batch was not acknowledged, because of ``error``."""

    index: int
    error: LiftbridgeError

    @property
    def may_be_stored(self) -> bool:
        return self.error.may_be_stored


class Failures(Sequence[PublishFailure]):
    """The failed messages of a batch, in index order: a read-only sequence of :class:`PublishFailure`.

    Messages that were never sent (a batch deadline or a lost connection left
    them) are kept as one range with one shared error, so a batch of millions
    reports its failures without work per message after its deadline.

    :param listed: index -> error of each failure with its own error.
    :param unsent_from: first index of the range of unsent messages (``size``: none).
    :param size: messages in the batch.
    :param unsent_error: the error of every unsent message without one of its own in ``listed``.
    """

    def __init__(
        self,
        listed: dict[int, LiftbridgeError] | None = None,
        *,
        unsent_from: int = 0,
        size: int = 0,
        unsent_error: LiftbridgeError | None = None,
    ) -> None:
        listed = listed or {}
        if unsent_error is None:
            unsent_from = size
        self._before = sorted((i, e) for i, e in listed.items() if i < unsent_from)
        self._in_range = {i: e for i, e in listed.items() if i >= unsent_from}
        self._unsent_from = unsent_from
        self._size = size
        self._unsent_error = unsent_error

    def __len__(self) -> int:
        return len(self._before) + self._size - self._unsent_from

    @overload
    def __getitem__(self, position: int) -> PublishFailure: ...

    @overload
    def __getitem__(self, position: slice) -> list[PublishFailure]: ...

    def __getitem__(self, position: int | slice) -> PublishFailure | list[PublishFailure]:
        if isinstance(position, slice):
            return [self[i] for i in range(*position.indices(len(self)))]
        if position < 0:
            position += len(self)
        if not 0 <= position < len(self):
            raise IndexError(f"failure {position} of {len(self)}")
        if position < len(self._before):
            return PublishFailure(*self._before[position])
        index = self._unsent_from + position - len(self._before)
        error = self._in_range.get(index, self._unsent_error)
        assert error is not None
        return PublishFailure(index, error)

    def __iter__(self) -> Iterator[PublishFailure]:
        for index, error in self._before:
            yield PublishFailure(index, error)
        for index in range(self._unsent_from, self._size):
            own = self._in_range.get(index, self._unsent_error)
            assert own is not None
            yield PublishFailure(index, own)

    def __repr__(self) -> str:
        return f"Failures({len(self)}: {self[:3]!r}{'...' if len(self) > 3 else ''})"

    def with_listed(self, change: Callable[[PublishFailure], PublishFailure]) -> Failures:
        """A copy with ``change`` applied to each failure that has its own error (not the shared one)."""
        listed = dict(self._before) | self._in_range
        changed = {index: change(PublishFailure(index, error)).error for index, error in listed.items()}
        return Failures(changed, unsent_from=self._unsent_from, size=self._size, unsent_error=self._unsent_error)


@dataclass
class BatchResult:
    """Outcome of ``publish_batch``: one entry per input message, in input order.

    ``acks[i]`` is the Ack of message i, or None when it failed or the ack
    policy is NONE. ``failures`` lists the failed messages by index (a
    :class:`Failures` sequence; a plain list works too).
    """

    acks: list[Ack | None]
    failures: Sequence[PublishFailure] = field(default_factory=Failures)

    @property
    def ok(self) -> bool:
        return not self.failures

    def raise_for_failures(self) -> None:
        if self.failures:
            raise BatchPublishError(self)


class BatchPublishError(LiftbridgeError):
    """Some messages of a batch failed; ``result`` holds the acks of the others and every failure."""

    def __init__(self, result: BatchResult) -> None:
        shown = "; ".join(f"#{f.index}: {f.error}" for f in result.failures[:5])
        more = f" (and {len(result.failures) - 5} more)" if len(result.failures) > 5 else ""
        first = result.failures[0].error
        super().__init__(
            f"{len(result.failures)} of {len(result.acks)} messages failed: {shown}{more}",
            stream=first.stream,
            code=first.code,
        )
        self.result = result
