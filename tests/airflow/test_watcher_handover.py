"""Watchers without shared streams (what Airflow before 3.3 runs): one event per trigger run, against a real server.

The triggerer of Airflow 3.1/3.2 calls ``run()`` and writes the events a run
yielded before it starts the trigger again. These tests play that triggerer:
each "run" is a fresh ``run()`` generator; the next run in the same process
must pass what the previous one handed over, and a run in another process (a
killed or moved triggerer) must send it again. The real `airflow triggerer` of
3.1 and 3.2 runs this in the compatibility tier (tests/compat).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from liftbridge_provider.client import LiftbridgeClient, PublishMessage
from liftbridge_provider.core.watching import CursorNames
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.triggers import handover
from liftbridge_provider.triggers.message import LiftbridgeMessageTrigger


@pytest.fixture
def server(liftbridge_server: DevServer, monkeypatch: pytest.MonkeyPatch) -> DevServer:
    connection = {"conn_type": "liftbridge", "host": ",".join(liftbridge_server.brokers)}
    monkeypatch.setenv("AIRFLOW_CONN_LIFTBRIDGE_DEFAULT", json.dumps(connection))
    return liftbridge_server


def new_stream(client: LiftbridgeClient, count: int) -> str:
    name = f"handover-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name)
    client.publish_batch(name, [PublishMessage(f"m{n}".encode(), partition=0) for n in range(count)])
    return name


async def one_run(trigger: LiftbridgeMessageTrigger) -> dict[str, Any]:
    """A whole run, as the triggerer drives it: its event, then the run ends by itself."""
    run: AsyncIterator[Any] = trigger.run()
    event = await asyncio.wait_for(run.__anext__(), 30)
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(run.__anext__(), 30)
    payload: dict[str, Any] = event.payload
    return payload


def as_another_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make this process look like another triggerer process (a new token)."""
    monkeypatch.setitem(handover._TOKENS, os.getpid(), handover.process_token() + 1)


def test_message_mode_passes_an_event_only_in_the_next_run_of_the_same_process(
    server: DevServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run 1 hands offset 0 over and leaves the cursor; run 2 (same process) passes it and hands 1 over; a run
    in another process does not know 1 was stored and sends it again; the run after it passes 1."""
    with LiftbridgeClient(server.brokers) as client:
        stream = new_stream(client, 3)
        position = CursorNames("h").position
        trigger = LiftbridgeMessageTrigger(stream=stream, cursor_id="h")

        first = asyncio.run(one_run(trigger))
        after_first = client.fetch_cursor(position, stream, 0)
        second = asyncio.run(one_run(trigger))
        after_second = client.fetch_cursor(position, stream, 0)
        as_another_process(monkeypatch)
        again = asyncio.run(one_run(trigger))
        after_again = client.fetch_cursor(position, stream, 0)
        third = asyncio.run(one_run(trigger))
        after_third = client.fetch_cursor(position, stream, 0)
    assert [first["offset"], second["offset"], again["offset"], third["offset"]] == [0, 1, 1, 2]
    assert [after_first, after_second, after_again, after_third] == [-1, 0, 0, 1]


def test_a_run_stopped_before_airflow_took_its_event_passes_nothing(server: DevServer) -> None:
    """A run cancelled at its event (the triggerer never took it) leaves no hand-over to confirm: the next run
    in the same process sends that offset again instead of passing it."""
    with LiftbridgeClient(server.brokers) as client:
        stream = new_stream(client, 2)
        trigger = LiftbridgeMessageTrigger(stream=stream, cursor_id="h")

        async def stopped_at_the_event() -> int:
            run: Any = trigger.run()
            event = await asyncio.wait_for(run.__anext__(), 30)
            await run.aclose()  # the generator is closed at its yield: the triggerer did not take the event
            offset: int = event.payload["offset"]
            return offset

        stopped = asyncio.run(stopped_at_the_event())
        again = asyncio.run(one_run(trigger))
        position = client.fetch_cursor(CursorNames("h").position, stream, 0)
    assert (stopped, again["offset"], position) == (0, 0, -1)


def test_batch_mode_records_a_batch_in_the_next_run_and_sends_it_again_from_another_process(
    server: DevServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 0 is recorded only by the run after the one that sent it; a run in another process sends the
    unrecorded batch again, identical."""
    with LiftbridgeClient(server.brokers) as client:
        stream = new_stream(client, 10)
        names = CursorNames("hb")
        trigger = LiftbridgeMessageTrigger(stream=stream, cursor_id="hb", mode="batch", max_messages=1,
                                           poll_interval=0.2)  # fmt: skip
        first = asyncio.run(one_run(trigger))
        recorded_after_first = client.fetch_cursor(names.recorded, stream, 0)
        client.publish_batch(stream, [PublishMessage(b"later", partition=0)] * 5)
        as_another_process(monkeypatch)
        resent = asyncio.run(one_run(trigger))
        recorded_after_resend = client.fetch_cursor(names.recorded, stream, 0)
        following = asyncio.run(one_run(trigger))
        recorded = client.fetch_cursor(names.recorded, stream, 0)
        position = client.fetch_cursor(names.position, stream, 0)
    assert first["metadata"]["batch"] == 0
    assert resent == first
    assert (recorded_after_first, recorded_after_resend) == (-1, -1)
    assert following["metadata"]["batch"] == 1
    assert [(r["start"], r["end"]) for r in following["ranges"]] == [(10, 15)]
    assert (recorded, position) == (0, 9)
