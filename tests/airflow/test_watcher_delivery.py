"""Watcher delivery under the failures Airflow's shared streams report, against a real server.

These tests drive Airflow's own ``SharedStreamManager`` (the triggerer's shared-stream
core: ack mode, persist confirmations, ack timeouts, rejects) in this process, the way
the triggerer's runner does, with the real watchers reading a real Liftbridge node. What
Airflow "stores" is what the runner loop below confirms; withholding a confirmation is
how Airflow reports an event it could not store. The real `airflow triggerer` process
runs the same faults end to end in ``test_airflow_watchers.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from airflow.triggers.shared_stream import SharedStreamManager

from liftbridge_provider.client import AsyncLiftbridgeClient, LiftbridgeClient, LiftbridgeError, StopPosition
from liftbridge_provider.core.watching import CursorNames
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.devserver.process import stop_process
from liftbridge_provider.triggers.message import LiftbridgeMessageTrigger
from liftbridge_provider.triggers.watchers import SUBSCRIPTIONS_OPENED

WAIT = 30.0  # seconds any wait below may take before the test fails


@pytest.fixture
def server(liftbridge_server: DevServer, monkeypatch: pytest.MonkeyPatch) -> DevServer:
    connection = {"conn_type": "liftbridge", "host": ",".join(liftbridge_server.brokers)}
    monkeypatch.setenv("AIRFLOW_CONN_LIFTBRIDGE_DEFAULT", json.dumps(connection))
    return liftbridge_server


@pytest.fixture
def functions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of apply_functions on the import path; returns its name."""
    name = f"watch_fns_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "def refuse_offset_3(payload):\n"
        "    if payload['offset'] == 3:\n"
        "        raise ValueError('cannot parse ' + payload['value'])\n"
        "    return payload\n"
        "def not_a_mapping(payload):\n"
        "    return ['offset', payload['offset']] if payload['offset'] == 3 else payload\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def new_stream(client: LiftbridgeClient, partitions: int = 1) -> str:
    name = f"deliver-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name, partitions=partitions)
    return name


def publish(client: LiftbridgeClient, stream: str, values: list[str], partition: int = 0) -> None:
    for value in values:
        client.publish(stream, value.encode(), partition=partition)


@dataclass
class Watcher:
    """One trigger run the way the triggerer's runner runs it: events bound, stored, then confirmed.

    ``refuse(payload)`` True: Airflow could not store that event (no confirmation comes).
    """

    manager: SharedStreamManager
    trigger: LiftbridgeMessageTrigger
    trigger_id: int
    refuse: Callable[[dict[str, Any]], bool] = lambda payload: False
    hold: asyncio.Event | None = None  # while set to an unset event, confirmations wait
    stored: list[dict[str, Any]] = field(default_factory=list)
    error: BaseException | None = None
    errors: list[BaseException] = field(default_factory=list)
    restart: bool = False  # start the trigger again after a failure, as the triggerer does
    task: asyncio.Task[None] | None = None

    def start(self) -> Watcher:
        self.task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        await self._run_once()
        while self.restart and self.error is not None:
            self.errors.append(self.error)
            self.error = None
            await asyncio.sleep(1)
            await self._run_once()

    async def _run_once(self) -> None:
        key = self.trigger.shared_stream_key()
        raw_events = self.manager.subscribe(trigger_id=self.trigger_id, trigger=self.trigger, key=key)
        events = self.trigger.filter_shared_stream(raw_events)
        try:
            async for event in events:
                seq = self.manager.bind_pending_event(trigger_id=self.trigger_id, key=key)
                if self.refuse(event.payload):
                    continue
                if self.hold is not None:
                    await self.hold.wait()
                self.stored.append(event.payload)
                if seq is not None:
                    self.manager.confirm_persisted([seq])
        except Exception as exc:  # the triggerer marks the trigger failed
            self.error = exc
        finally:
            await self.manager.unsubscribe(self.trigger_id, key)

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    def offsets(self) -> list[int]:
        return [payload["offset"] for payload in self.stored]


async def until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.05)


async def cursor(server: DevServer, cursor_id: str, stream: str, partition: int = 0) -> int:
    async with AsyncLiftbridgeClient(server.brokers) as client:
        return await client.fetch_cursor(cursor_id, stream, partition)


def test_start_from_latest_keeps_its_start_across_a_restart_before_the_first_message(server: DevServer) -> None:
    """An empty partition's "latest" start was stored as -1 ("never set"), so a
    watcher restarted before its first message recomputed "latest" and skipped what arrived meanwhile."""
    with LiftbridgeClient(server.brokers) as client:
        stream = new_stream(client)

        async def scenario() -> list[int]:
            trigger = LiftbridgeMessageTrigger(stream=stream, start_from="latest", cursor_id="latest")
            first = Watcher(SharedStreamManager(), trigger, 1).start()
            # the watcher has chosen its start and stored it (its reader starts after that)
            await until(lambda: SUBSCRIPTIONS_OPENED[(stream, 0)] >= 1, "the first watcher to subscribe")
            await first.stop()
            await asyncio.to_thread(publish, client, stream, ["while down 0", "while down 1"])
            second = Watcher(SharedStreamManager(), trigger, 1).start()
            await until(lambda: len(second.stored) >= 2, "the two messages published while it was down")
            await second.stop()
            return second.offsets()

        assert asyncio.run(scenario()) == [0, 1]


def test_an_auto_paused_partition_is_a_quiet_partition_not_a_failure(server: DevServer) -> None:
    """A partition that auto-pauses (1 s without a message) under a message-mode watcher is quiet, not
    failed: the watcher keeps waiting without an error, and so does one started again while the partition
    is paused (so the triggerer does not restart it in a loop); neither resumes the partition while nothing
    is published (the activity stream shows no resume), and what is published later is delivered, nothing
    lost or repeated."""
    with LiftbridgeClient(server.brokers) as client:
        stream = f"paused-{uuid.uuid4().hex[:8]}"
        client.create_stream(stream, stream, auto_pause_time=1)
        publish(client, stream, ["m0", "m1"])
        trigger = LiftbridgeMessageTrigger(stream=stream, cursor_id="paused")

        def changes() -> list[str]:
            events = client.activity(stop=StopPosition.latest(), timeout=WAIT)
            return [e.op for e in events if e.stream == stream and e.op in ("pause_stream", "resume_stream")]

        async def scenario() -> tuple[Watcher, Watcher, list[str]]:
            first = Watcher(SharedStreamManager(), trigger, 1).start()
            await until(lambda: len(first.stored) >= 2, "the first two messages")
            ends = asyncio.get_running_loop().time() + WAIT
            while "pause_stream" not in await asyncio.to_thread(changes):
                assert asyncio.get_running_loop().time() < ends, "the partition did not auto-pause"
                await asyncio.sleep(0.5)
            await asyncio.sleep(3)  # the watcher meets the paused partition, then waits on it
            await first.stop()
            again = Watcher(SharedStreamManager(), trigger, 1).start()  # started on the paused partition
            await asyncio.sleep(3)
            while_paused = await asyncio.to_thread(changes)
            await asyncio.to_thread(publish, client, stream, ["m2", "m3"])
            await until(lambda: len(again.stored) >= 2 or again.error is not None, "the two published later")
            await again.stop()
            return first, again, while_paused

        first, again, while_paused = asyncio.run(scenario())
    for watcher in (first, again):
        assert watcher.error is None, f"a paused partition failed the watcher: {watcher.error!r}"
    assert first.offsets() == [0, 1]
    assert again.offsets() == [2, 3]
    assert while_paused == ["pause_stream"], f"a watcher resumed the paused partition: {while_paused}"


def test_a_readonly_partition_is_a_quiet_partition_and_is_read_again_once_writable(server: DevServer) -> None:
    """The server ends a subscription at the end of a readonly partition: the watcher's reader of that
    partition just stopped, for good (a message published once it was writable again never came), and a
    watcher started on it with its cursor at the end failed at once ("stop offset is before start offset"),
    on every restart. Both now wait without an error and deliver what is published once it is writable."""
    with LiftbridgeClient(server.brokers) as client:
        stream = new_stream(client)
        publish(client, stream, ["m0", "m1"])
        client.set_stream_readonly(stream, readonly=True)
        trigger = LiftbridgeMessageTrigger(stream=stream, cursor_id="readonly")

        async def scenario() -> tuple[Watcher, Watcher]:
            first = Watcher(SharedStreamManager(), trigger, 1).start()
            await until(lambda: len(first.stored) >= 2 or first.error is not None, "the first two messages")
            await asyncio.sleep(3)  # the subscription met the end of the readonly partition
            await first.stop()
            again = Watcher(SharedStreamManager(), trigger, 1).start()  # its cursor at the readonly end
            await asyncio.sleep(3)
            await asyncio.to_thread(client.set_stream_readonly, stream, readonly=False)
            await asyncio.to_thread(publish, client, stream, ["m2", "m3"])
            await until(lambda: len(again.stored) >= 2 or again.error is not None, "the two published later")
            await again.stop()
            return first, again

        first, again = asyncio.run(scenario())
    for watcher in (first, again):
        assert watcher.error is None, f"a readonly partition failed the watcher: {watcher.error!r}"
    assert first.offsets() == [0, 1]
    assert again.offsets() == [2, 3]


def test_a_watcher_keeps_reading_a_partition_made_readonly_then_writable(server: DevServer) -> None:
    """One watcher across the change: it reads to the readonly end, then, once the partition is writable
    again, what is published next (its reader had ended for good)."""
    with LiftbridgeClient(server.brokers) as client:
        stream = new_stream(client)
        publish(client, stream, ["m0"])
        trigger = LiftbridgeMessageTrigger(stream=stream, cursor_id="readonly-once")

        async def scenario() -> Watcher:
            watcher = Watcher(SharedStreamManager(), trigger, 1).start()
            await until(lambda: len(watcher.stored) >= 1 or watcher.error is not None, "the first message")
            await asyncio.to_thread(client.set_stream_readonly, stream, readonly=True)
            await asyncio.sleep(3)
            await asyncio.to_thread(client.set_stream_readonly, stream, readonly=False)
            await asyncio.to_thread(publish, client, stream, ["m1"])
            await until(lambda: len(watcher.stored) >= 2 or watcher.error is not None, "the one published later")
            await watcher.stop()
            return watcher

        watcher = asyncio.run(scenario())
    assert watcher.error is None, repr(watcher.error)
    assert watcher.offsets() == [0, 1]


def test_poison_message_without_a_dead_letter_stream_fails_loudly_and_is_not_passed(
    server: DevServer, functions: str
) -> None:
    """A message the apply_function refuses must neither be skipped silently
    (the cursor moved past it when the failed trigger unsubscribed) nor pass without a word."""
    with LiftbridgeClient(server.brokers) as client:
        stream = new_stream(client)
        publish(client, stream, [f"m{n}" for n in range(6)])

        async def run_once() -> Watcher:
            trigger = LiftbridgeMessageTrigger(
                stream=stream, cursor_id="poison", apply_function=f"{functions}.refuse_offset_3"
            )
            watcher = Watcher(SharedStreamManager(), trigger, 1).start()
            await until(lambda: watcher.task is not None and watcher.task.done(), "the watcher to fail")
            return watcher

        async def scenario() -> tuple[Watcher, Watcher, int]:
            first = await run_once()
            again = await run_once()  # the triggerer restarts a failed watcher: same message, same failure
            return first, again, await cursor(server, "poison", stream)

        first, again, position = asyncio.run(scenario())
    assert first.offsets() == [0, 1, 2]
    assert again.offsets() == []
    for watcher in (first, again):
        assert watcher.error is not None
        assert f"{stream}/0 offset 3" in str(watcher.error), watcher.error
        assert "cannot parse m3" in str(watcher.error), watcher.error
        assert "dlq_stream" in str(watcher.error), "the error must say how to get past the message"
    assert position == 2, "the cursor passed a message that no event was stored for"


@pytest.mark.parametrize("function", ["refuse_offset_3", "not_a_mapping"])
def test_poison_message_goes_to_the_dead_letter_stream_with_its_origin(
    server: DevServer, functions: str, function: str
) -> None:
    """With ``dlq_stream``, a refused message is published there (created if
    missing) with headers naming its origin and the error, before the cursor passes it."""
    with LiftbridgeClient(server.brokers) as client:
        stream = new_stream(client, partitions=2)
        dlq = f"{stream}-dlq"
        publish(client, stream, [f"m{n}" for n in range(6)], partition=1)

        async def scenario() -> tuple[Watcher, int]:
            trigger = LiftbridgeMessageTrigger(
                stream=stream,
                partitions=[1],
                cursor_id="poison",
                apply_function=f"{functions}.{function}",
                dlq_stream=dlq,
            )
            watcher = Watcher(SharedStreamManager(), trigger, 1).start()
            await until(lambda: len(watcher.stored) >= 5, "the five good messages")
            await until(lambda: client.fetch_cursor("poison", stream, 1) == 5, "the cursor to pass the last one")
            await watcher.stop()
            return watcher, await cursor(server, "poison", stream, 1)

        watcher, position = asyncio.run(scenario())
        assert watcher.error is None, watcher.error
        assert watcher.offsets() == [0, 1, 2, 4, 5]
        assert position == 5
        partitions = client.fetch_metadata([dlq]).stream(dlq).partitions
        assert len(partitions) == 2, "the dead-letter stream gets the source's partition count"
        (dead,) = list(client.read_range(dlq, 1, 0, client.fetch_partition_metadata(dlq, 1).high_watermark + 1))
    assert dead.value == b"m3"
    headers = dict(dead.headers)
    assert headers["lb-dlq-stream"] == stream.encode()
    assert headers["lb-dlq-partition"] == b"1"
    assert headers["lb-dlq-offset"] == b"3"
    assert headers["lb-dlq-cursor-id"] == b"poison"
    expected = b"cannot parse m3" if function == "refuse_offset_3" else b"must return a dict"
    assert expected in headers["lb-dlq-error"], headers["lb-dlq-error"]


def test_event_airflow_could_not_store_is_never_committed_past(server: DevServer) -> None:
    """Of two watchers sharing a reader, one fails to store offset 2 (its ack
    times out) while the other stores everything: the cursor must stay below 2 and a restarted
    watcher gets offset 2 again."""
    with LiftbridgeClient(server.brokers) as client:
        stream = new_stream(client)
        publish(client, stream, [f"m{n}" for n in range(6)])

        def watchers(manager: SharedStreamManager, refuse: int | None) -> tuple[Watcher, Watcher]:
            def make(trigger_id: int) -> LiftbridgeMessageTrigger:
                return LiftbridgeMessageTrigger(stream=stream, cursor_id="failing", max_in_flight=3)

            failing = Watcher(manager, make(1), 1, refuse=lambda p: p["offset"] == refuse)
            return failing.start(), Watcher(manager, make(2), 2).start()

        async def scenario() -> tuple[Watcher, int, Watcher]:
            failing, other = watchers(SharedStreamManager(ack_timeout=1.0), refuse=2)
            await until(lambda: failing.error is not None, "the ack timeout to fail the first watcher")
            await until(lambda: other.task is not None and other.task.done(), "the group to end")
            after_failure = await cursor(server, "failing", stream)
            again, _ = watchers(SharedStreamManager(ack_timeout=30.0), refuse=None)
            await until(lambda: 5 in again.offsets(), "the restarted watcher to reach offset 5")
            return failing, after_failure, again

        failing, after_failure, again = asyncio.run(scenario())
    assert after_failure <= 1, f"the cursor moved to {after_failure}, past offset 2 that was never stored"
    assert 2 not in failing.offsets()
    assert again.offsets()[0] == after_failure + 1
    assert sorted(set(failing.offsets()) | set(again.offsets())) == list(range(6))


def test_a_stale_triggerer_does_not_move_the_cursor_back(server: DevServer) -> None:
    """A triggerer that was frozen while another took over its watchers must not
    overwrite the cursor the other one moved on; it stops and says so."""
    with LiftbridgeClient(server.brokers) as client:
        stream = new_stream(client)
        publish(client, stream, [f"m{n}" for n in range(5)])

        async def scenario() -> tuple[Watcher, Watcher, int]:
            trigger = LiftbridgeMessageTrigger(stream=stream, cursor_id="fenced")
            frozen = asyncio.Event()
            stale = Watcher(SharedStreamManager(), trigger, 1, hold=frozen).start()
            await asyncio.sleep(1.5)  # the stale watcher holds offset 0, not yet stored
            current = Watcher(SharedStreamManager(), trigger, 1).start()
            await until(lambda: client.fetch_cursor("fenced", stream, 0) == 4, "the new owner to reach offset 4")
            frozen.set()  # the stale triggerer wakes up and stores its event
            await until(lambda: stale.task is not None and stale.task.done(), "the stale watcher to stop")
            await current.stop()
            return stale, current, await cursor(server, "fenced", stream)

        stale, current, position = asyncio.run(scenario())
    assert current.offsets() == [0, 1, 2, 3, 4]
    assert position == 4, f"the stale triggerer moved the cursor back to {position}"
    assert stale.error is not None
    assert "moved by another writer from -1 to 4" in str(stale.error), stale.error


def batch_trigger(stream: str, **options: Any) -> LiftbridgeMessageTrigger:
    return LiftbridgeMessageTrigger(
        stream=stream, mode="batch", cursor_id="batches", max_messages=5, max_wait=30, poll_interval=0.2, **options
    )


def test_a_stale_batch_triggerer_does_not_record_over_the_new_owner(server: DevServer) -> None:
    """The same in batch mode: a frozen triggerer that wakes up after another took over must
    not move ``batch-recorded`` back (nor write batch slots) under the new owner."""
    names = CursorNames("batches")
    with LiftbridgeClient(server.brokers) as client:
        stream = new_stream(client)
        publish(client, stream, [f"m{n}" for n in range(5)])

        async def scenario() -> tuple[Watcher, Watcher, int]:
            frozen = asyncio.Event()
            stale = Watcher(SharedStreamManager(), batch_trigger(stream), 1, hold=frozen).start()
            await until(lambda: client.fetch_cursor(names.planned, stream, 0) == 0, "batch 0 to be planned")
            current = Watcher(SharedStreamManager(), batch_trigger(stream), 1).start()
            await until(lambda: len(current.stored) == 1, "the new owner to send batch 0 again")
            await asyncio.to_thread(publish, client, stream, [f"m{n}" for n in range(5, 10)])
            await until(lambda: client.fetch_cursor(names.recorded, stream, 0) == 1, "batch 1 to be recorded")
            frozen.set()
            await until(lambda: stale.task is not None and stale.task.done(), "the stale watcher to stop")
            await current.stop()
            return stale, current, await cursor(server, names.recorded, stream)

        stale, current, recorded = asyncio.run(scenario())
    assert [p["metadata"]["batch"] for p in current.stored] == [0, 1]
    assert recorded == 1, f"the stale triggerer moved batch-recorded back to {recorded}"
    assert stale.error is not None
    assert "moved by another writer from -1 to 1" in str(stale.error), stale.error


def test_batch_airflow_could_not_store_is_sent_again_identical(server: DevServer) -> None:
    """A batch whose event Airflow failed to store must end the reader (not leave
    it waiting for a record that never comes) and come again, identical, when the watcher restarts."""
    names = CursorNames("batches")
    with LiftbridgeClient(server.brokers) as client:
        stream = new_stream(client)
        publish(client, stream, [f"m{n}" for n in range(6)])

        async def scenario() -> tuple[Watcher, Watcher, int]:
            failing = Watcher(SharedStreamManager(ack_timeout=1.0), batch_trigger(stream), 1, refuse=lambda p: True)
            failing.start()
            await until(lambda: failing.task is not None and failing.task.done(), "the unstored batch to end it")
            recorded = await cursor(server, names.recorded, stream)
            again = Watcher(SharedStreamManager(), batch_trigger(stream), 1).start()
            await until(lambda: len(again.stored) == 1, "the batch to come again")
            await again.stop()
            return failing, again, recorded

        failing, again, recorded = asyncio.run(scenario())
    assert failing.error is not None
    assert recorded == -1
    (batch,) = again.stored
    assert batch["metadata"]["batch"] == 0
    assert batch["ranges"] == [{"partition": 0, "start": 0, "end": 6}]


def test_a_cursor_write_that_fails_ends_the_group_and_repeats_only_the_event_in_flight(
    server: DevServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SetCursor that fails (here: the server frozen past the request timeout)
    must not stall the partition; the group ends and restarts from the cursor, repeating at most
    ``max_in_flight`` events."""
    connection = {"conn_type": "liftbridge", "host": ",".join(server.brokers), "extra": {"request_timeout": 2}}
    monkeypatch.setenv("AIRFLOW_CONN_LIFTBRIDGE_DEFAULT", json.dumps(connection))
    pid = server.nodes[0].process.pid
    assert pid is not None
    with LiftbridgeClient(server.brokers) as client:
        stream = new_stream(client)
        publish(client, stream, [f"m{n}" for n in range(6)])

        async def scenario() -> tuple[Watcher, Watcher]:
            trigger = LiftbridgeMessageTrigger(stream=stream, cursor_id="frozen-write")
            release = asyncio.Event()
            first = Watcher(SharedStreamManager(), trigger, 1, refuse=lambda p: False, hold=release).start()
            await until(lambda: client.fetch_cursor("frozen-write", stream, 0) == -1, "the watcher to start")
            await asyncio.sleep(1)  # it holds offset 0
            stop_process(pid)
            try:
                release.set()  # stored; the cursor write now meets a frozen server
                await until(lambda: first.task is not None and first.task.done(), "the failed write to end the group")
            finally:
                os.kill(pid, signal.SIGCONT)
            second = Watcher(SharedStreamManager(), trigger, 1).start()
            await until(lambda: 5 in second.offsets(), "the restarted watcher to reach offset 5")
            await second.stop()
            return first, second

        first, second = asyncio.run(scenario())
    assert first.error is not None
    both = first.offsets() + second.offsets()
    assert sorted(set(both)) == list(range(6))
    assert len(both) - len(set(both)) <= 1, f"more than the one event in flight came twice: {both}"


@pytest.mark.cluster
def test_watcher_follows_a_new_leader_while_the_old_one_is_frozen(
    liftbridge_cluster: DevServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader that vanished without a reset (SIGSTOP) must not leave the watcher
    waiting forever while a new leader takes writes."""
    connection = {"conn_type": "liftbridge", "host": ",".join(liftbridge_cluster.brokers)}
    monkeypatch.setenv("AIRFLOW_CONN_LIFTBRIDGE_DEFAULT", json.dumps(connection))
    with LiftbridgeClient(liftbridge_cluster.brokers, request_timeout=10) as client:
        stream = f"deliver-{uuid.uuid4().hex[:8]}"
        client.create_stream(stream, stream, replication_factor=3)
        leader = client.fetch_partition_metadata(stream, 0).leader
        assert leader is not None
        publish(client, stream, ["before 0", "before 1"])

        async def scenario() -> tuple[Watcher, float]:
            trigger = LiftbridgeMessageTrigger(stream=stream, cursor_id="frozen-leader")
            watcher = Watcher(SharedStreamManager(), trigger, 1, restart=True).start()
            await until(lambda: len(watcher.stored) >= 2, "the first two messages")
            pid = liftbridge_cluster.node(leader).process.pid
            assert pid is not None
            stop_process(pid)
            try:
                frozen_at = asyncio.get_running_loop().time()
                await asyncio.to_thread(_publish_to_new_leader, client, stream, leader)
                await until(lambda: {2, 3} <= set(watcher.offsets()), "the messages the new leader took", 120)
                took = asyncio.get_running_loop().time() - frozen_at
            finally:
                os.kill(pid, signal.SIGCONT)
            await watcher.stop()
            return watcher, took

        watcher, took = asyncio.run(scenario())
    offsets = watcher.offsets()
    assert sorted(set(offsets)) == [0, 1, 2, 3]
    assert len(offsets) - len(set(offsets)) <= 1, offsets
    print(f"delivered from the new leader {took:.1f}s after the freeze; restarts: {watcher.errors}")


def _publish_to_new_leader(client: LiftbridgeClient, stream: str, old: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        leader = None
        with contextlib.suppress(LiftbridgeError):
            leader = client.fetch_metadata([stream]).stream(stream).partitions[0].leader
        if leader is not None and leader != old:
            break
        assert time.monotonic() < deadline, "no new leader within 60 s"
        time.sleep(0.2)
    client.publish_batch(stream, [b"after 2", b"after 3"], ack_policy="leader")
