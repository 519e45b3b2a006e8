"""Moving a cursor forward: the one rule every writer of a cursor follows, as a plan without I/O.

Liftbridge has no compare-and-set for cursors: SetCursor stores whatever it is
given. So a move is fetch, decide, set, and optionally read back:

1. fetch the cursor of each partition moved (``found``);
2. decide each partition from ``found``, the ``target`` and where this writer
   last saw the cursor (``expected``; None when it has no earlier view):

   - ``found == target``: ALREADY_THERE, nothing to write (a repeated move is a no-op);
   - ``expected`` given and ``found != expected``: MOVED, another writer moved it since;
   - ``found > target``: MOVED, it is past the target (writing would move it back);
   - otherwise WRITE;

3. when no partition is MOVED, set every WRITE partition; otherwise write
   nothing and raise :class:`~liftbridge_provider.client.errors.CursorMovedError`
   for the first MOVED one (so a writer that lost its view learns it);
4. with ``verify``, read every written cursor back: another value means another
   writer set it between this writer's check and its read back (CursorMovedError
   with ``overwritten=True``).

What the rule prevents: a writer moving a cursor back, and a writer that knows
where it last saw the cursor overwriting another writer's move it had not seen.
What it cannot prevent: another writer's set that lands between this writer's
fetch and its set is overwritten, and the last write wins (the cursor may then
move back). The read back sees such an overwrite only when the other writer's
set lands after this writer's and before its read back; the writer whose set
came last never learns anything. It detects a second writer, it does not
exclude one: keep one writer per cursor.

The sync (:meth:`LiftbridgeClient.advance_cursors`) and asyncio
(:meth:`AsyncLiftbridgeClient.advance_cursors`) clients drive the plan: it yields
:class:`Fetch` (send back the cursor's offset) and :class:`Store` (send back None)
and returns each partition's :class:`CursorMove`.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass

from liftbridge_provider.client.errors import CursorMovedError
from liftbridge_provider.core.checks import (
    check_cursor_id,
    check_flag,
    check_offset,
    check_partition,
    check_stream_name,
)
from liftbridge_provider.core.errors import InvalidArgumentError


class CursorStep(enum.Enum):
    """What the rule decided for one partition's cursor."""

    WRITE = "write"
    ALREADY_THERE = "already there"
    MOVED = "moved by another writer"


@dataclass(frozen=True)
class CursorMove:
    """One partition's decision: where the cursor was ``found``, the ``target``, where this writer last saw
    it (``expected``, None: no earlier view) and the ``step`` taken."""

    cursor_id: str
    stream: str
    partition: int
    found: int
    target: int
    expected: int | None
    step: CursorStep

    def refusal(self) -> CursorMovedError:
        """The error that tells the writer of a MOVED decision where the cursor is."""
        where = f"cursor {self.cursor_id!r} of {self.stream}/{self.partition} is at {self.found}"
        if self.expected is not None and self.found != self.expected:
            message = (
                f"{where}, not at {self.expected} where this writer last saw it: another writer moved it; "
                f"not moved to {self.target}"
            )
        else:
            message = f"{where}, past {self.target}: not moved back"
        return self._error(message, overwritten=False)

    def overwritten(self, read_back: int) -> CursorMovedError:
        """The error for a written cursor that read back ``read_back`` instead of the target."""
        message = (
            f"cursor {self.cursor_id!r} of {self.stream}/{self.partition} read back {read_back} right after it "
            f"was set to {self.target}: another writer set it in between (the last write wins)"
        )
        return self._error(message, overwritten=True, found=read_back)

    def _error(self, message: str, *, overwritten: bool, found: int | None = None) -> CursorMovedError:
        return CursorMovedError(
            message,
            cursor_id=self.cursor_id,
            stream=self.stream,
            partition=self.partition,
            found=self.found if found is None else found,
            target=self.target,
            expected=self.expected,
            overwritten=overwritten,
        )


def decide(found: int, target: int, expected: int | None) -> CursorStep:
    """The rule for one cursor (see the module docstring)."""
    if found == target:
        return CursorStep.ALREADY_THERE
    if expected is not None and found != expected:
        return CursorStep.MOVED
    if found > target:
        return CursorStep.MOVED
    return CursorStep.WRITE


def check_advance(
    cursor_id: str, stream: str, offsets: object, expected: object
) -> tuple[dict[int, int], dict[int, int | None]]:
    """``(targets, expected views)`` by partition, checked (InvalidArgumentError naming the bad value): offsets
    >= -1, views >= -1 or None, no target behind the writer's own view, no view of a partition not moved."""
    check_cursor_id(cursor_id)
    check_stream_name(stream)
    if not isinstance(offsets, Mapping):
        raise InvalidArgumentError(f"offsets must map partitions to offsets, got {offsets!r}", stream=stream)
    if expected is not None and not isinstance(expected, Mapping):
        raise InvalidArgumentError(f"expected must map partitions to offsets (or None), got {expected!r}")
    targets = {
        check_partition(p, stream=stream): check_offset(o, "cursor offset", minimum=-1) for p, o in offsets.items()
    }
    views: dict[int, int | None] = dict.fromkeys(targets)
    for partition, view in (expected or {}).items():
        if partition not in targets:
            raise InvalidArgumentError(f"expected names partition {partition!r}, which is not moved", stream=stream)
        if view is None:
            continue
        views[partition] = check_offset(view, "expected offset", minimum=-1)
        if targets[partition] < view:
            raise InvalidArgumentError(
                f"partition {partition}: {targets[partition]} is behind {view}, where this writer last saw the "
                "cursor: a cursor never moves back",
                stream=stream,
                partition=partition,
            )
    return targets, views


@dataclass(frozen=True)
class Fetch:
    """Fetch the cursor of ``partition``; send back its offset (-1: never set)."""

    partition: int


@dataclass(frozen=True)
class Store:
    """Set the cursor of ``partition`` to ``offset``; send back None."""

    partition: int
    offset: int


Plan = Generator[Fetch | Store, int | None, dict[int, CursorMove]]


def advance(
    cursor_id: str,
    stream: str,
    offsets: Mapping[int, int],
    expected: Mapping[int, int | None] | None = None,
    *,
    verify: bool = False,
) -> Plan:
    """The plan of one move of ``cursor_id`` on ``stream`` to ``offsets`` (by partition); see the module docstring.

    The input is checked at the first step, before any action is yielded.
    """
    check_flag(verify, "verify")  # "no" is truthy: it would have verified
    targets, views = check_advance(cursor_id, stream, offsets, expected)
    found: dict[int, int] = {}
    for partition in sorted(targets):
        found[partition] = _offset((yield Fetch(partition)))
    moves = {
        p: CursorMove(cursor_id, stream, p, found[p], targets[p], views[p], decide(found[p], targets[p], views[p]))
        for p in sorted(targets)
    }
    for move in moves.values():
        if move.step is CursorStep.MOVED:
            raise move.refusal()
    written = [move for move in moves.values() if move.step is CursorStep.WRITE]
    for move in written:
        yield Store(move.partition, move.target)
    if verify:
        for move in written:
            read_back = _offset((yield Fetch(move.partition)))
            if read_back != move.target:
                raise move.overwritten(read_back)
    return moves


def _offset(sent: int | None) -> int:
    assert sent is not None, "a Fetch is answered with the cursor's offset"
    return sent


def run(plan: Plan, fetch: Callable[[int], int], store: Callable[[int, int], None]) -> dict[int, CursorMove]:
    """Carry a plan out with blocking calls (the sync client's driver)."""
    answer: int | None = None
    while not isinstance(step := _next(plan, answer), dict):
        if isinstance(step, Store):
            store(step.partition, step.offset)
        answer = fetch(step.partition) if isinstance(step, Fetch) else None
    return step


async def run_async(
    plan: Plan, fetch: Callable[[int], Awaitable[int]], store: Callable[[int, int], Awaitable[None]]
) -> dict[int, CursorMove]:
    """Carry a plan out with awaited calls (the asyncio client's driver; the same steps as :func:`run`)."""
    answer: int | None = None
    while not isinstance(step := _next(plan, answer), dict):
        if isinstance(step, Store):
            await store(step.partition, step.offset)
        answer = await fetch(step.partition) if isinstance(step, Fetch) else None
    return step


def _next(plan: Plan, answer: int | None) -> Fetch | Store | dict[int, CursorMove]:
    """The plan's next action after ``answer``, or its result once it returns."""
    try:
        return plan.send(answer)
    except StopIteration as done:
        result: dict[int, CursorMove] = done.value
        return result
