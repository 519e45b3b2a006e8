"""SubscriptionState.window/took/passed_stop: on_message's rule applied to many messages at once.

The column path (Subscription.column_batches) lets a builder skip and end by the state's window and tells
the state afterwards what it took; the per-message path asks on_message. Both must deliver the same
offsets, end at the same place and leave the state where a resubscription starts from the same offset.
"""

from __future__ import annotations

import random

import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import columns
from liftbridge_provider.client.columns import END, FULL, LAST, TAKEN
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.reading import SubscriptionState, Verdict

CONFIG = ClientConfig(brokers=("10.0.0.1:9292",), liveness_interval=30)
BUILDERS = [columns.PYTHON_BUILDER] + ([columns.COMPILED_BUILDER] if columns.COMPILED_BUILDER else [])


def new_state(start: int | None, stop: int | None) -> SubscriptionState:
    if start is None:
        request = api.SubscribeRequest(stream="s", partition=0, startPosition=api.EARLIEST)
    else:
        request = api.SubscribeRequest(stream="s", partition=0, startPosition=api.OFFSET, startOffset=start)
    return SubscriptionState(CONFIG, request, stop_offset=stop, timeout=None, idle_timeout=None, resubscribe_wait=5)


def per_message(state: SubscriptionState, calls: list[list[int]]) -> list[int]:
    delivered: list[int] = []
    for offsets in calls:
        for offset in offsets:
            verdict = state.on_message(offset)
            if verdict is Verdict.SKIP:
                continue
            if verdict is Verdict.END:
                return delivered
            delivered.append(offset)
            if verdict is Verdict.DELIVER_LAST:
                return delivered
    return delivered


def by_window(state: SubscriptionState, calls: list[list[int]], builder: type[columns.ColumnBuilder]) -> list[int]:
    made = builder(max_rows=3, max_bytes=1 << 20)
    delivered: list[int] = []
    for offsets in calls:  # one Subscribe call each: the window is set when a call opens
        made.window(*state.window())
        for offset in offsets:
            data = api.Message(offset=offset).SerializeToString()
            status = made.add(data)
            if status == FULL:
                delivered += columns.finish(made).offsets_list()
                status = made.add(data)
            if made.last_offset is not None and status in (TAKEN, LAST):
                state.took(made.last_offset, last=status == LAST)
            if status == END:
                state.passed_stop()
            if state.ended:
                return delivered + columns.finish(made).offsets_list()
    return delivered + columns.finish(made).offsets_list()


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("seed", range(40))
def test_window_delivers_what_on_message_delivers(builder: type[columns.ColumnBuilder], seed: int) -> None:
    chance = random.Random(seed)
    start = chance.choice([None, 0, 5])
    stop = chance.choice([None, 8, 12, 30])
    calls = []
    position = chance.randrange(0, 6)
    for _ in range(chance.randrange(1, 4)):  # each call may restart earlier, with gaps (compaction)
        position = max(0, position - chance.randrange(0, 4))
        offsets = []
        for _ in range(chance.randrange(0, 10)):
            position += chance.choice([1, 1, 1, 2, 3])
            offsets.append(position)
        calls.append(offsets)
    one, many = new_state(start, stop), new_state(start, stop)
    assert by_window(many, calls, builder) == per_message(one, calls)
    assert (many.next_offset, many.last_offset, many.ended) == (one.next_offset, one.last_offset, one.ended)
    assert many.reached_stop == one.reached_stop


def test_window_bounds_default_to_the_int64_limits() -> None:
    assert new_state(None, None).window() == (-(2**63), 2**63 - 1)
    assert new_state(7, 9).window() == (7, 9)


def test_only_a_delivered_stop_offset_means_the_server_ends_the_call() -> None:
    """The server ends a Subscribe call right after the stop offset itself, and goes on past a stop offset that
    compaction removed: only in the first case does the reader wait for the call's end (to release the call,
    tests/server/test_read_memory.py); in the second it would wait for the call's deadline."""
    at_stop, past_stop = new_state(0, 3), new_state(0, 3)
    assert [at_stop.on_message(offset) for offset in (2, 3)] == [Verdict.DELIVER, Verdict.DELIVER_LAST]
    assert [past_stop.on_message(offset) for offset in (2, 5)] == [Verdict.DELIVER, Verdict.END]
    assert (at_stop.ended, at_stop.reached_stop) == (True, True)
    assert (past_stop.ended, past_stop.reached_stop) == (True, False)
    taken, passed = new_state(0, 3), new_state(0, 3)
    taken.took(3, last=True)  # a column builder's LAST: it took the stop offset
    passed.took(2, last=False)
    passed.passed_stop()  # its END: a message above the stop offset
    assert (taken.ended, taken.reached_stop) == (True, True)
    assert (passed.ended, passed.reached_stop) == (True, False)
