"""The offset sensor and its trigger on a real node, driven in process: the trigger's run() on asyncio as the
triggerer drives it, the sensor's poke() as a worker calls it."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.devserver import DevServer

CONN_ID = "lb_offset_waits"


@pytest.fixture
def stream(liftbridge_server: DevServer, client: LiftbridgeClient, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new stream with one message (offset 0), and the connection CONN_ID to the node."""
    connection = {"conn_type": "liftbridge", "host": ",".join(liftbridge_server.brokers)}
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(connection))
    name = f"waits-{uuid.uuid4().hex[:10]}"
    client.create_stream(name, name)
    client.publish(name, b"first", ack_policy="all")
    return name


def test_the_triggers_timeout_is_a_deadline_whatever_its_poll_interval(stream: str) -> None:
    """The trigger looked at its timeout only between sleeps of a whole poll interval: with poll_interval=1e9
    and timeout=2 no event came at all (and poll_interval=inf was accepted). The last sleep now ends at the
    timeout, and the timeout event comes."""
    from liftbridge_provider.triggers.offset import LiftbridgeOffsetTrigger  # noqa: PLC0415 - Airflow reads its home

    trigger = LiftbridgeOffsetTrigger(
        stream=stream, targets={0: 5}, liftbridge_conn_id=CONN_ID, poll_interval=1e9, timeout=1.0
    )

    async def first_event() -> Any:
        async for event in trigger.run():
            return event
        return None

    started = time.monotonic()
    event = asyncio.run(asyncio.wait_for(first_event(), 30))
    assert event.payload["status"] == "timeout", event.payload
    assert event.payload["missing"] == {"0": 5}
    assert time.monotonic() - started < 1.0 + 10, "the timeout event comes at the timeout, not a poll later"


def test_a_templated_target_offset_is_read_and_an_impossible_one_refused(stream: str) -> None:
    """target_offset is a template field, so a template gives text: "0" was refused as not a whole number.
    And 2**64, beyond any offset, was accepted: the sensor would have poked until its timeout (7 days by
    default). Now the text is read, and the impossible target fails the task without retries."""
    from airflow.sdk.exceptions import AirflowFailException  # noqa: PLC0415 - Airflow reads its home on import

    from liftbridge_provider.sensors.offset import LiftbridgePartitionOffsetSensor  # noqa: PLC0415

    reached = LiftbridgePartitionOffsetSensor(
        task_id="templated", stream=stream, target_offset="0", liftbridge_conn_id=CONN_ID
    )
    assert reached.poke({}) is True
    impossible = LiftbridgePartitionOffsetSensor(
        task_id="impossible", stream=stream, target_offset=2**64, liftbridge_conn_id=CONN_ID
    )
    with pytest.raises(AirflowFailException, match="target_offset must be at most 9223372036854775807"):
        impossible.poke({})
