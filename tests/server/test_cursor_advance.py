"""Moving a cursor forward with one rule (``advance_cursor``/``advance_cursors``), against a real server.

Liftbridge has no compare-and-set for cursors: SetCursor just writes. The rule
is fetch, decide, set (and, when asked, read back): a cursor never moves back,
and a writer that finds the cursor elsewhere than it last saw it is told so
with CursorMovedError instead of overwriting. The sync and asyncio clients are
driven by the same plan; each test runs both.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from liftbridge_provider.client import (
    AsyncLiftbridgeClient,
    CursorMovedError,
    CursorStep,
    InvalidArgumentError,
    LiftbridgeClient,
    PublishMessage,
)
from liftbridge_provider.client.groups import group_cursor
from liftbridge_provider.devserver import DevServer

FRONTS = ["sync", "asyncio"]


def new_stream(client: LiftbridgeClient, partitions: int = 1) -> str:
    name = f"adv-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name, partitions=partitions)
    return name


class Front:
    """``advance_cursors`` through the sync client, or through a fresh asyncio client."""

    def __init__(self, kind: str, server: DevServer, client: LiftbridgeClient) -> None:
        self.kind, self.server, self.client = kind, server, client

    def advance(self, cursor_id: str, stream: str, offsets: Mapping[int, int], **options: Any) -> Any:
        if self.kind == "sync":
            return self.client.advance_cursors(cursor_id, stream, offsets, **options)

        async def run() -> Any:
            async with AsyncLiftbridgeClient(self.server.brokers) as aio:
                return await aio.advance_cursors(cursor_id, stream, offsets, **options)

        return asyncio.run(run())

    def advance_one(self, cursor_id: str, stream: str, partition: int, offset: int, **options: Any) -> Any:
        if self.kind == "sync":
            return self.client.advance_cursor(cursor_id, stream, partition, offset, **options)

        async def run() -> Any:
            async with AsyncLiftbridgeClient(self.server.brokers) as aio:
                return await aio.advance_cursor(cursor_id, stream, partition, offset, **options)

        return asyncio.run(run())


@pytest.mark.parametrize("kind", FRONTS)
def test_a_cursor_only_moves_forward_and_a_writer_that_lost_its_view_is_told(
    kind: str, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """Writes, repeats and refusals of one cursor: a move forward is written; the same move again finds it
    already there and writes nothing; a move back is refused; a writer whose last view of the cursor is not
    where the cursor is gets CursorMovedError naming both, and the cursor stays where the other writer put it."""
    front, stream = Front(kind, liftbridge_server, client), new_stream(client)
    first = front.advance_one("c", stream, 0, 5)
    assert (first.step, first.found, first.target) == (CursorStep.WRITE, -1, 5)
    assert front.advance_one("c", stream, 0, 5, expected=-1).step is CursorStep.ALREADY_THERE
    with pytest.raises(CursorMovedError, match=r"cursor 'c' of .*/0 is at 5, past 3: not moved back") as back:
        front.advance_one("c", stream, 0, 3)
    assert (back.value.found, back.value.target, back.value.expected) == (5, 3, None)
    with pytest.raises(CursorMovedError, match=r"is at 5, not at 4 where this writer last saw it") as moved:
        front.advance_one("c", stream, 0, 9, expected=4)
    assert (moved.value.stream, moved.value.partition, moved.value.found) == (stream, 0, 5)
    assert client.fetch_cursor("c", stream, 0) == 5
    assert front.advance_one("c", stream, 0, 9, expected=5).step is CursorStep.WRITE
    assert client.fetch_cursor("c", stream, 0) == 9


@pytest.mark.parametrize("kind", FRONTS)
def test_bad_moves_are_refused_before_anything_is_sent(
    kind: str, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """Bad input names the value: checked before any call (the stream does not even exist, and the error is
    not NoSuchStreamError), including a move behind where the writer itself last saw the cursor."""
    front, missing = Front(kind, liftbridge_server, client), f"missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(InvalidArgumentError, match=r"cursor offset must be a whole number >= -1, got -2"):
        front.advance_one("c", missing, 0, -2)
    with pytest.raises(InvalidArgumentError, match=r"expected offset must be a whole number >= -1, got 'x'"):
        front.advance_one("c", missing, 0, 3, expected="x")
    with pytest.raises(InvalidArgumentError, match=r"partition 0: 3 is behind 7, where this writer last saw"):
        front.advance_one("c", missing, 0, 3, expected=7)
    with pytest.raises(InvalidArgumentError, match=r"expected names partition 1, which is not moved"):
        front.advance("c", missing, {0: 3}, expected={1: 2})


@pytest.mark.parametrize("kind", FRONTS)
def test_several_partitions_move_together_or_not_at_all(
    kind: str, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """``advance_cursors`` checks every partition before it writes any: one moved by another writer refuses
    the whole move and no partition is written."""
    front, stream = Front(kind, liftbridge_server, client), new_stream(client, partitions=3)
    client.set_cursor("c", stream, 1, 7)  # another writer
    with pytest.raises(CursorMovedError, match=r"/1 is at 7, not at -1") as moved:
        front.advance("c", stream, {0: 3, 1: 4, 2: 5}, expected={0: -1, 1: -1, 2: -1})
    assert moved.value.partition == 1
    assert [client.fetch_cursor("c", stream, p) for p in range(3)] == [-1, 7, -1]
    moves = front.advance("c", stream, {0: 3, 1: 8, 2: 5}, expected={0: -1, 1: 7, 2: -1})
    assert [moves[p].step for p in range(3)] == [CursorStep.WRITE] * 3
    assert [client.fetch_cursor("c", stream, p) for p in range(3)] == [3, 8, 5]


@pytest.mark.parametrize("kind", FRONTS)
def test_a_read_back_tells_the_writer_whose_write_was_overwritten(
    kind: str, liftbridge_server: DevServer, client: LiftbridgeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer sets the cursor right after this writer's SetCursor (between its check and its read
    back). Without ``verify`` the move reports a write (the race the rule cannot see); with ``verify`` the
    read back finds the other value and raises CursorMovedError saying the write was overwritten."""
    front, stream = Front(kind, liftbridge_server, client), new_stream(client)
    other = LiftbridgeClient(liftbridge_server.brokers)
    sync_set, async_set = LiftbridgeClient.set_cursor, AsyncLiftbridgeClient.set_cursor

    def set_then_overwritten(self: LiftbridgeClient, cursor_id: str, stream: str, partition: int, offset: int,
                             **kw: Any) -> None:  # fmt: skip
        sync_set(self, cursor_id, stream, partition, offset, **kw)
        sync_set(other, cursor_id, stream, partition, 99)

    async def aset_then_overwritten(self: AsyncLiftbridgeClient, cursor_id: str, stream: str, partition: int,
                                    offset: int, **kw: Any) -> None:  # fmt: skip
        await async_set(self, cursor_id, stream, partition, offset, **kw)
        await asyncio.to_thread(sync_set, other, cursor_id, stream, partition, 99)

    monkeypatch.setattr(LiftbridgeClient, "set_cursor", set_then_overwritten)
    monkeypatch.setattr(AsyncLiftbridgeClient, "set_cursor", aset_then_overwritten)
    try:
        assert front.advance_one("c", stream, 0, 5).step is CursorStep.WRITE, "unseen without a read back"
        sync_set(other, "c", stream, 0, 5)
        with pytest.raises(CursorMovedError, match=r"read back 99 right after it was set to 6") as lost:
            front.advance_one("c", stream, 0, 6, expected=5, verify=True)
        assert (lost.value.found, lost.value.target) == (99, 6)
    finally:
        other.close()


def publish(client: LiftbridgeClient, stream: str, count: int) -> None:
    client.publish_batch(stream, [PublishMessage(f"m{n}".encode(), partition=0) for n in range(count)])


def test_a_members_late_checkpoint_never_moves_the_groups_cursor_back(client: LiftbridgeClient) -> None:
    """A sync member processed offsets 0-9 but had not checkpointed them when another writer (the
    partition's next owner, after this member was dropped from the group) moved the group's cursor to 15.
    Its checkpoint on close must leave 15, not move the cursor back to 9 (the next owner would read
    10-15 again)."""
    stream, group = new_stream(client), f"g-{uuid.uuid4().hex[:6]}"
    publish(client, stream, 20)
    with client.consumer(group, auto_offset="earliest", auto_checkpoint=None) as member:
        member.subscribe([stream])
        read = [m.offset for _, m in zip(range(10), member.messages(timeout=30), strict=False)]
        client.set_cursor(group_cursor(group), stream, 0, 15)
    assert read == list(range(10))
    assert client.fetch_cursor(group_cursor(group), stream, 0) == 15


def test_an_asyncio_members_late_checkpoint_never_moves_the_groups_cursor_back(
    liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """The asyncio member in the same case as the sync one above: its checkpoint leaves the cursor at 15."""
    stream, group = new_stream(client), f"g-{uuid.uuid4().hex[:6]}"
    publish(client, stream, 20)

    async def scenario() -> list[int]:
        async with AsyncLiftbridgeClient(liftbridge_server.brokers) as aio:
            read = []
            async with aio.consumer(group, auto_offset="earliest", auto_checkpoint=None) as member:
                await member.subscribe([stream])
                async for message in member.messages(timeout=30):
                    read.append(message.offset)
                    if len(read) == 10:
                        break
                await asyncio.to_thread(client.set_cursor, group_cursor(group), stream, 0, 15)
            return read

    assert asyncio.run(scenario()) == list(range(10))
    assert client.fetch_cursor(group_cursor(group), stream, 0) == 15
