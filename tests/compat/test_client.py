"""The client's own calls on this target's grpcio and protobuf (pyspark-4.0 holds the package's floors of both).

The Spark and Airflow tests go through the reader's column builders and the
operators; this one goes through the client's every kind of call once: unary
calls, the shared publish stream, a batch on the client's HTTP/2 call, bounded
reads (messages parsed by protobuf), cursors and the asyncio client. Seconds.
"""

from __future__ import annotations

import asyncio
import uuid

from liftbridge_provider.client import AsyncLiftbridgeClient, LiftbridgeClient, StopPosition
from liftbridge_provider.devserver import DevServer


def test_every_kind_of_call_works_on_this_grpcio_and_protobuf(liftbridge_server: DevServer) -> None:
    name = f"compat-client-{uuid.uuid4().hex[:8]}"
    values = [f"m{n}".encode() for n in range(2000)]  # reads of many messages at a time
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        client.create_stream(name, name)
        ack = client.publish(name, b"first", ack_policy="all")
        assert ack is not None
        assert ack.offset == 0
        acks = client.publish_batch(name, values, ack_policy="all").acks
        assert [a.offset if a is not None else None for a in acks] == list(range(1, 2001))
        assert [m.value for m in client.read_range(name, 0, 0, 2001)] == [b"first", *values]
        client.set_cursor("compat", name, 0, 2000)
        assert client.fetch_cursor("compat", name, 0) == 2000
        assert client.fetch_partition_metadata(name, 0).high_watermark == 2000

    async def read_async() -> list[bytes]:
        async with AsyncLiftbridgeClient(liftbridge_server.brokers) as client:
            messages = client.subscribe(name, 0, 0, stop=StopPosition.at_offset(2000), timeout=30)
            return [m.value async for m in messages]

    assert asyncio.run(read_async()) == [b"first", *values]
