"""LiftbridgeMessageSensor and LiftbridgeAwaitMessageTrigger, by `airflow dags test` on a real node.

`airflow dags test` runs a deferred sensor's trigger inline, on the asyncio client, as the triggerer would.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from liftbridge_provider.client import LiftbridgeClient, PublishMessage
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.triggers.await_message import LiftbridgeAwaitMessageTrigger
from tests.airflow.airflow_runs import connection_env, run_dag, stream_name, write_marked_sensors

FUNCTIONS = '''
import json

def order_over(message, limit):
    """The order's id when its amount is over ``limit``, else None."""
    order = json.loads(message.value)
    return order["id"] if order["amount"] > limit else None
'''


@pytest.fixture
def functions(airflow_home: Path) -> str:
    (airflow_home / "dags" / "sensor_functions.py").write_text(FUNCTIONS)
    return "sensor_functions.order_over"


def order(number: int, amount: int) -> bytes:
    return f'{{"id": "o{number}", "amount": {amount}}}'.encode()


def test_a_match_published_after_the_sensor_deferred_ends_it_with_the_functions_value(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient, functions: str, tmp_path: Path
) -> None:
    stream = stream_name()
    client.create_stream(stream, stream, partitions=2)
    client.publish_batch(stream, [PublishMessage(order(0, 500), partition=0)])  # before: 'latest' skips it
    marker = tmp_path / "sensor-deferred"
    write_marked_sensors(airflow_home)

    def publish_after_the_sensor_deferred() -> None:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        client.publish_batch(stream, [PublishMessage(order(n, 10 * n), partition=n % 2) for n in range(1, 8)])

    publisher = threading.Thread(target=publish_after_the_sensor_deferred)
    publisher.start()
    body = f"""
        from marked_sensors import MarkedMessageSensor

        deferred = MarkedMessageSensor(
            task_id="deferred", stream={stream!r}, apply_function="{functions}", apply_function_args=[45],
            deferrable=True, timeout=120, cursor_id="orders", commit_cursor=True, marker={str(marker)!r},
        )
        poked = LiftbridgeMessageSensor(
            task_id="poked", stream={stream!r}, apply_function="{functions}", apply_function_kwargs={{"limit": 65}},
            start={{"0": 0, "1": 0}}, poke_interval=1, timeout=30, mode="poke",
        )
        deferred >> poked
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    publisher.join()
    assert run.ok(), run.output[-4000:]
    # Over 45, the first match of either partition: o5 (partition 1, offset 2) or o6 (partition 0, offset 3;
    # o0 before it is older than the sensor's start); the cursor of that partition moved to it.
    found = run.xcom["deferred"]
    where = {"o5": (1, 2), "o6": (0, 3)}
    assert found["stream"] == stream
    assert found["value"] in where
    assert (found["partition"], found["offset"]) == where[found["value"]]
    partition, offset = where[found["value"]]
    assert client.fetch_cursor("orders", stream, partition) == offset
    assert client.fetch_cursor("orders", stream, 1 - partition) == -1
    # Over 65, polled from the start: o7 (partition 1, offset 3); o0 (500, before) is on partition 0 offset 0.
    assert run.xcom["poked"]["value"] in {"o0", "o7"}


def test_no_match_before_the_timeout_fails_the_task_cleanly(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient, functions: str
) -> None:
    stream = stream_name()
    client.create_stream(stream, stream)
    client.publish_batch(stream, [order(n, 1) for n in range(5)])
    body = f"""
        LiftbridgeMessageSensor(
            task_id="deferred", stream={stream!r}, apply_function="{functions}", apply_function_args=[100],
            start="cursor", cursor_id="never", deferrable=True, timeout=3,
        )
        LiftbridgeMessageSensor(
            task_id="poked", stream={stream!r}, apply_function="{functions}", apply_function_args=[100],
            poke_interval=1, timeout=3, mode="poke",
        )
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert run.states == {"deferred": "failed", "poked": "failed"}, run.output[-3000:]
    assert run.tries == {"deferred": 1, "poked": 1}


def test_the_trigger_serializes_and_round_trips() -> None:
    trigger = LiftbridgeAwaitMessageTrigger(
        stream="orders",
        start_offsets={0: 5, "1": 7},
        apply_function="sensor_functions.order_over",
        apply_function_args=[45],
        apply_function_kwargs={"x": "y"},
        liftbridge_conn_id="lb",
        timeout=30,
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "liftbridge_provider.triggers.await_message.LiftbridgeAwaitMessageTrigger"
    again = LiftbridgeAwaitMessageTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert again.start_offsets == {0: 5, 1: 7}


@pytest.mark.parametrize("start", [0, 2], ids=["before-the-readonly-end", "at-the-readonly-end"])
def test_the_deferred_wait_reads_a_readonly_partition_again_once_it_is_writable(
    liftbridge_server: DevServer, client: LiftbridgeClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    start: int,
) -> None:  # fmt: skip
    """On a readonly partition the server ends the subscription at the end (or refuses one that starts past
    it): the deferred wait then never saw a match published once the partition was writable again (it timed
    out), or failed at once without retries, where a poke on the next interval finds it. It now waits on
    the partition's high watermark and reads on, as the poke mode does."""
    module = f"await_fns_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "def says_match(message):\n    return message.value.decode() if message.value == b'match' else None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    connection = {"conn_type": "liftbridge", "host": liftbridge_server.brokers[0]}
    monkeypatch.setenv("AIRFLOW_CONN_LIFTBRIDGE_DEFAULT", json.dumps(connection))
    stream = stream_name()
    client.create_stream(stream, stream)
    client.publish_batch(stream, [b"x", b"y"])
    client.set_stream_readonly(stream, readonly=True)
    trigger = LiftbridgeAwaitMessageTrigger(
        stream=stream, start_offsets={0: start}, apply_function=f"{module}.says_match", timeout=20
    )

    async def scenario() -> dict[str, Any]:
        async def first_event() -> Any:
            return await anext(trigger.run())

        waiting = asyncio.create_task(first_event())
        await asyncio.sleep(3)
        assert not waiting.done(), waiting.result().payload
        await asyncio.to_thread(client.set_stream_readonly, stream, readonly=False)
        await asyncio.to_thread(client.publish, stream, b"match")
        event = await waiting
        return dict(event.payload)

    payload = asyncio.run(scenario())
    assert payload["status"] == "success", payload
    assert payload["offset"] == 2
