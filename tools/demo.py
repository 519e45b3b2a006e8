"""The main job until the example ingestion DAG exists: a round trip through a real server.

Starts a Liftbridge node on 127.0.0.1, creates a stream, publishes a few keyed
messages (waiting for each ack), reads them back with a bounded subscription
and stops the node. Exits non-zero if anything read differs from what was sent.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider._proto import liftbridge_api_pb2_grpc as api_grpc
from liftbridge_provider.devserver import start_single

log = logging.getLogger("demo")
STREAM = "demo-events"
MESSAGES = [(f"user-{i % 3}".encode(), f"event {i}".encode()) for i in range(10)]


def round_trip(stub: Any) -> list[tuple[int, bytes, bytes]]:
    stub.CreateStream(api.CreateStreamRequest(subject="demo.events", name=STREAM, partitions=1), timeout=10)
    for key, value in MESSAGES:
        request = api.PublishRequest(stream=STREAM, key=key, value=value, ackPolicy=api.ALL, expectedOffset=-1)
        ack = stub.Publish(request, timeout=10).ack
        log.info("published %s=%s at offset %d", key.decode(), value.decode(), ack.offset)
    subscribe = api.SubscribeRequest(
        stream=STREAM,
        startPosition=api.EARLIEST,
        stopPosition=api.STOP_OFFSET,
        stopOffset=len(MESSAGES) - 1,
    )
    received: list[tuple[int, bytes, bytes]] = []
    messages = stub.Subscribe(subscribe, timeout=30)
    try:
        next(messages)  # the first message is empty: it only confirms the subscription
        received.extend((m.offset, m.key, m.value) for m in messages)
    except grpc.RpcError as exc:  # the stream ends with "stop offset reached"
        if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise
    return received


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with start_single() as server:
        log.info("liftbridge running at %s (data in %s)", server.brokers[0], server.root)
        with grpc.insecure_channel(server.brokers[0]) as channel:
            received = round_trip(api_grpc.APIStub(channel))
    expected = [(offset, key, value) for offset, (key, value) in enumerate(MESSAGES)]
    for offset, key, value in received:
        log.info("read offset %d: %s=%s", offset, key.decode(), value.decode())
    if received != expected:
        log.error("read back %d messages that differ from the %d published", len(received), len(expected))
        return 1
    log.info("demo ok: %d messages published and read back; server stopped", len(received))
    return 0


if __name__ == "__main__":
    sys.exit(main())
