"""cProfile of one hot path at a time, against a real single-node server (the profiles in docs/benchmarks.md).

    .venv/bin/python bench/profile_paths.py PATH [--messages N] [--top K]

PATH is one of batch-builder, nats-publish, grpc-publish, read-range, read-slice, sync-publish, sync-steps:

- ``batch-builder``: the Spark source's record_batches over N received messages (256-byte values, the
  server's two headers), no server needed; prints microseconds per row unprofiled, next to the cost of
  only reading every field of each message once (the floor of any Python builder) and of the column
  builders (compiled and pure-Python) decoding the same messages from their serialized bytes into Arrow
  batches (the Spark task's path), then the profile of record_batches.
- ``nats-publish``: NatsBatchPublisher over N prepared requests, run on this thread so the profile sees it.
- ``grpc-publish``: BatchPublisher (publish_batch without NATS: the PublishAsync stream on its own HTTP/2
  connection) over N prepared requests, on this thread; prints the cost of building the requests apart.
- ``read-range``: ``read_range`` over N messages of one partition.
- ``read-slice``: the Spark task's ``read_slice`` over the same (record batches of the source's schema, decoded
  by the column builder this process uses; ``LIFTBRIDGE_PURE_PYTHON=1`` for the pure-Python one).
- ``sync-publish``: N ``publish`` calls in a loop (the shared PublishAsync stream).
- ``sync-steps``: N ``publish`` calls, each timed at its steps (the client's code, the look at the stream's
  socket, the write, the wait for the ack's read, the read, the hand-over to the caller); p50 of each, no
  profiler.

A profile, not a benchmark: cProfile roughly doubles the time of Python code, so read the shares.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import statistics
import time
import timeit
from collections.abc import Callable
from functools import partial

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import LiftbridgeClient, NatsConfig, columns
from liftbridge_provider.client import requests as build
from liftbridge_provider.client.h2.blocking import BlockingCall
from liftbridge_provider.client.messages import AckPolicy
from liftbridge_provider.client.publish.broker_stream import BrokerStream
from liftbridge_provider.client.publish.nats_publisher import NatsBatchPublisher
from liftbridge_provider.client.publish.prepare import batch_requests
from liftbridge_provider.client.publish.publisher import BatchPublisher
from liftbridge_provider.core.spark_planning import Slice
from liftbridge_provider.devserver import DevServer, start_single
from liftbridge_provider.spark.batches import arrow_batch, record_batches
from liftbridge_provider.spark.options import parse_options
from liftbridge_provider.spark.reader import arrow_schema, read_slice

VALUE = os.urandom(256)


def profile(label: str, work: Callable[[], object], count: int, top: int) -> None:
    work()  # warm-up: imports, first connections
    started = time.perf_counter()
    work()
    plain = time.perf_counter() - started
    print(f"{label}: {count / plain:,.0f} per second unprofiled ({plain / count * 1e6:.2f} us each)")
    profiler = cProfile.Profile()
    profiler.enable()
    work()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def received_messages(count: int) -> list[api.Message]:
    messages = []
    for offset in range(count):
        sent = api.Message(offset=offset, key=b"k%d" % offset, value=VALUE, timestamp=1_700_000_000_000_000_000)
        sent.subject = "orders"
        sent.headers["subject"] = b"orders"
        sent.headers["reply"] = b""
        messages.append(api.Message.FromString(sent.SerializeToString()))
    return messages


def batch_builder(count: int, top: int) -> None:
    messages = received_messages(count)

    def build_all() -> None:
        for _ in record_batches(messages, arrow_schema(), "orders", 0, max_rows=10_000, max_bytes=64 << 20):
            pass

    def read_fields() -> None:
        for raw in messages:
            headers = raw.headers
            raw.offset, raw.timestamp, raw.subject, raw.key, raw.value  # noqa: B018 - reading is the point
            for name in list(headers):
                headers[name]

    floor = min(timeit.repeat(read_fields, number=1, repeat=5))
    print(f"reading every field of a message once: {floor / count * 1e6:.2f} us a row (the floor of a builder)")
    serialized = [message.SerializeToString() for message in messages]
    for name, kind in (("compiled", columns.COMPILED_BUILDER), ("pure-Python", columns.PYTHON_BUILDER)):
        if kind is None:
            continue
        seconds = min(timeit.repeat(partial(decode_columns, kind, serialized), number=1, repeat=5))
        print(f"{name} column builder + arrow_batch from serialized messages: {seconds / count * 1e6:.2f} us a row")
    profile("record_batches rows", build_all, count, top)


def decode_columns(kind: type[columns.ColumnBuilder], serialized: list[bytes]) -> None:
    """The Spark task's decoding without the network: serialized responses -> column builder -> Arrow."""
    builder, schema = kind(max_rows=10_000, max_bytes=64 << 20), arrow_schema()
    for data in serialized:
        if builder.add(data) == columns.FULL:
            arrow_batch(columns.finish(builder), schema, "orders", 0)
            builder.add(data)
    arrow_batch(columns.finish(builder), schema, "orders", 0)


def with_stream(server: DevServer, client: LiftbridgeClient, name: str) -> str:
    client.create_stream(name, name)
    client.wait_for_high_watermark(name, 0, -1, timeout=10)
    return name


def nats_publish(server: DevServer, client: LiftbridgeClient, count: int, top: int) -> None:
    config = NatsConfig(servers=tuple(server.nats_servers))
    names = iter(range(3))

    def publish_all() -> None:
        name = with_stream(server, client, f"nats-{next(names)}")
        requests = [
            build.publish_request(name, VALUE, partition=0, ack_policy=AckPolicy.LEADER, correlation_id=str(i))
            for i in range(count)
        ]
        # A plain loop, not asyncio.run: in the main thread that installs a SIGINT handler holding the task,
        # and restoring it formats the task's repr, result included (every ack of the batch) into the profile.
        loop = asyncio.new_event_loop()
        try:
            result = loop.run_until_complete(
                NatsBatchPublisher(config, requests, {0: name}, window=1024, ack_wait=5, deadline=None)._run()
            )
        finally:
            loop.close()
        assert result.ok, result.failures[:3]

    profile("NATS publish_batch messages (stream creation included)", publish_all, count, top)


def grpc_publish(server: DevServer, client: LiftbridgeClient, count: int, top: int) -> None:
    names = iter(range(3))

    def publish_all() -> None:
        name = with_stream(server, client, f"grpc-{next(names)}")
        started = time.process_time()
        requests = batch_requests(client._router, name, [VALUE] * count, None, policy=AckPolicy.LEADER, deadline=None)
        built = time.process_time() - started
        publisher = BatchPublisher(client._router, requests, window=1024, ack_wait=5, deadline=None)
        loop = asyncio.new_event_loop()  # on this thread (see nats_publish), plain asyncio
        try:
            result = loop.run_until_complete(publisher._run())
        finally:
            loop.close()
        assert result.ok, result.failures[:3]
        print(f"  building the requests: {built / count * 1e6:.2f} us of CPU a message")

    profile("gRPC publish_batch messages (stream creation included)", publish_all, count, top)


def read_range(server: DevServer, client: LiftbridgeClient, count: int, top: int) -> None:
    name = with_stream(server, client, "reads")
    client.publish_batch(name, [VALUE] * count)
    profile("read_range messages", lambda: sum(1 for _ in client.read_range(name, 0, 0, count)), count, top)


def read_slice_path(server: DevServer, client: LiftbridgeClient, count: int, top: int) -> None:
    name = with_stream(server, client, "slices")
    client.publish_batch(name, [VALUE] * count)
    options = parse_options({"brokers": ",".join(server.brokers), "ranges": "{}"})
    schema = arrow_schema()

    def read_all() -> int:
        return sum(batch.num_rows for batch in read_slice(options, name, Slice(0, 0, count), schema))

    profile("read_slice rows", read_all, count, top)


def sync_publish(server: DevServer, client: LiftbridgeClient, count: int, top: int) -> None:
    name = with_stream(server, client, "sync")

    def publish_all() -> None:
        for _ in range(count):
            client.publish(name, VALUE)

    profile("publish calls", publish_all, count, top)


def sync_steps(server: DevServer, client: LiftbridgeClient, count: int, top: int) -> None:
    """p50 of each step of a single publish, from timestamps taken by wrappers around the shared stream's call."""
    name = with_stream(server, client, "steps")
    stamps: dict[str, float] = {}

    def stamped(owner: type, method: str, label: str) -> None:
        original = getattr(owner, method)

        def wrapper(self: object, *args: object) -> object:
            stamps[label] = time.perf_counter()
            result = original(self, *args)
            stamps[label + " done"] = time.perf_counter()
            return result

        setattr(owner, method, wrapper)

    stamped(BrokerStream, "send", "stream")
    stamped(BlockingCall, "news", "look")
    stamped(BlockingCall, "send", "write")
    stamped(BlockingCall, "_read", "read")  # the read that brings the ack
    stamped(BrokerStream, "result", "result")
    client.publish(name, VALUE)
    steps: dict[str, list[float]] = {}
    for _ in range(count):
        started = time.perf_counter()
        client.publish(name, VALUE)
        ended = time.perf_counter()
        spans = {
            "client code before the shared stream": stamps["stream"] - started,
            "the look at the stream's socket (news)": stamps["look done"] - stamps["look"],
            "the write (framing, the socket's send)": stamps["write done"] - stamps["write"],
            "write -> the ack's read (the server)": stamps["read"] - stamps["write done"],
            "the read (recv, frames, responses cut)": stamps["read done"] - stamps["read"],
            "read -> caller back from publish": ended - stamps["read done"],
            "whole publish": ended - started,
        }
        for label, seconds in spans.items():
            steps.setdefault(label, []).append(seconds)
    print(f"{count} publishes, p50 of each step (us):")
    for label, durations in steps.items():
        print(f"  {label:50s} {statistics.median(durations) * 1e6:8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "path",
        choices=[
            "batch-builder",
            "nats-publish",
            "grpc-publish",
            "read-range",
            "read-slice",
            "sync-publish",
            "sync-steps",
        ],
    )
    parser.add_argument("--messages", type=int, default=None, help="messages (100000; 3000 for sync-publish)")
    parser.add_argument("--top", type=int, default=20, help="functions shown (20)")
    args = parser.parse_args()
    count = args.messages or (3_000 if args.path.startswith("sync") else 100_000)
    if args.path == "batch-builder":
        batch_builder(count, args.top)
        return
    runs = {
        "nats-publish": nats_publish,
        "grpc-publish": grpc_publish,
        "read-range": read_range,
        "read-slice": read_slice_path,
        "sync-publish": sync_publish,
        "sync-steps": sync_steps,
    }
    with start_single() as server, LiftbridgeClient(server.brokers) as client:
        runs[args.path](server, client, count, args.top)


if __name__ == "__main__":
    main()
