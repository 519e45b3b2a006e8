"""The cursor-advance rule (client/cursor_advance.py), without a server: decisions, input checks, the plan."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from liftbridge_provider.client import CursorMovedError, InvalidArgumentError
from liftbridge_provider.client.cursor_advance import (
    CursorMove,
    CursorStep,
    Fetch,
    Store,
    advance,
    decide,
    run,
)


@pytest.mark.parametrize(
    ("found", "target", "expected", "step"),
    [
        (-1, 5, None, CursorStep.WRITE),  # never set: forward
        (3, 5, 3, CursorStep.WRITE),  # where this writer saw it: forward
        (5, 5, None, CursorStep.ALREADY_THERE),
        (5, 5, 3, CursorStep.ALREADY_THERE),  # someone (maybe an earlier try) put it exactly there
        (4, 5, 3, CursorStep.MOVED),  # another writer moved it, even forward
        (2, 5, 3, CursorStep.MOVED),  # or back
        (7, 5, None, CursorStep.MOVED),  # past the target: never back
        (7, 5, 3, CursorStep.MOVED),
    ],
)
def test_one_rule_decides_write_already_there_or_moved(found: int, target: int, expected: int | None,
                                                       step: CursorStep) -> None:  # fmt: skip
    """The decision from where the cursor is, where it should go and where this writer last saw it."""
    assert decide(found, target, expected) is step


def drive(plan: object, cursors: dict[int, int], *, overwrite: Mapping[int, int] | None = None) -> list[object]:
    """Run a plan against an in-memory cursor table; ``overwrite`` sets a partition right after a Store."""
    actions: list[object] = []

    def fetch(partition: int) -> int:
        actions.append(Fetch(partition))
        return cursors.get(partition, -1)

    def store(partition: int, offset: int) -> None:
        actions.append(Store(partition, offset))
        cursors[partition] = (overwrite or {}).get(partition, offset)

    actions.append(run(plan, fetch, store))  # type: ignore[arg-type]
    return actions


def test_every_partition_is_fetched_and_decided_before_any_is_written() -> None:
    """The plan fetches all partitions, writes only the WRITE ones, and returns every decision."""
    cursors = {0: 4, 1: 9}
    *actions, moves = drive(advance("c", "s", {0: 9, 1: 9, 2: 3}, {0: 4}), cursors)
    assert actions == [Fetch(0), Fetch(1), Fetch(2), Store(0, 9), Store(2, 3)]
    assert isinstance(moves, dict)
    assert [moves[p].step for p in (0, 1, 2)] == [CursorStep.WRITE, CursorStep.ALREADY_THERE, CursorStep.WRITE]
    assert moves[2] == CursorMove("c", "s", 2, -1, 3, None, CursorStep.WRITE)
    assert cursors == {0: 9, 1: 9, 2: 3}


def test_a_moved_partition_refuses_the_whole_move_and_nothing_is_written() -> None:
    """One partition moved by another writer: CursorMovedError naming it, and no Store at all."""
    cursors = {0: 4, 1: 6}
    plan = advance("c", "s", {0: 9, 1: 9}, {0: 4, 1: 5})
    with pytest.raises(CursorMovedError, match=r"cursor 'c' of s/1 is at 6, not at 5 where this writer last saw"):
        drive(plan, cursors)
    assert cursors == {0: 4, 1: 6}
    past = advance("c", "s", {0: 3})
    with pytest.raises(CursorMovedError, match=r"cursor 'c' of s/0 is at 4, past 3: not moved back") as error:
        drive(past, cursors)
    assert (error.value.found, error.value.target, error.value.expected, error.value.overwritten) == (4, 3, None, False)


def test_verify_reads_every_written_cursor_back_and_reports_an_overwrite() -> None:
    """With verify, each written partition is fetched again after all writes; another value is reported."""
    *actions, _ = drive(advance("c", "s", {0: 5, 1: 6}, verify=True), {})
    assert actions == [Fetch(0), Fetch(1), Store(0, 5), Store(1, 6), Fetch(0), Fetch(1)]
    with pytest.raises(CursorMovedError, match=r"s/1 read back 99 right after it was set to 6") as error:
        drive(advance("c", "s", {0: 5, 1: 6}, verify=True), {}, overwrite={1: 99})
    assert (error.value.found, error.value.overwritten) == (99, True)


@pytest.mark.parametrize(
    ("offsets", "expected", "message"),
    [
        ({0: -2}, None, r"cursor offset must be a whole number >= -1, got -2"),
        ({0: True}, None, r"cursor offset must be a whole number >= -1, got True"),
        ({-1: 3}, None, r"partition must be a whole number >= 0, got -1"),
        ([3], None, r"offsets must map partitions to offsets, got \[3\]"),
        ({0: 3}, [1], r"expected must map partitions to offsets \(or None\), got \[1\]"),
        ({0: 3}, {0: -5}, r"expected offset must be a whole number >= -1, got -5"),
        ({0: 3}, {0: 7}, r"partition 0: 3 is behind 7, where this writer last saw the cursor"),
        ({0: 3}, {1: 2}, r"expected names partition 1, which is not moved"),
    ],
)
def test_bad_input_is_refused_before_the_first_action(offsets: object, expected: object, message: str) -> None:
    """The plan checks everything before it yields its first action, and names the bad value."""
    plan = advance("c", "s", offsets, expected)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=message):
        next(plan)


def test_bad_names_are_refused_before_the_first_action() -> None:
    with pytest.raises(InvalidArgumentError, match="cursor"):
        next(advance("", "s", {0: 1}))
    with pytest.raises(InvalidArgumentError, match="stream"):
        next(advance("c", "", {0: 1}))
