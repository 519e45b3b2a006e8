"""Measure gufo-liftbridge 0.2.0 in its own process; started by ``bench_client.py``, prints one JSON line.

gufo's generated protobuf module registers the same proto package ("proto")
in protobuf's default descriptor pool as liftbridge_provider's, so the two
clients cannot share a process. This worker only imports gufo.

    python bench/_gufo_worker.py publish   --broker 127.0.0.1:PORT --stream S --messages N --size 256 --server-pid P
    python bench/_gufo_worker.py subscribe --broker 127.0.0.1:PORT --stream S --messages N --server-pid P

``publish`` sends N messages of ``--size`` bytes to partition 0 with
``publish_bulk(wait=True)`` (ack policy LEADER) and times the last ack
("seconds") and the return of ``publish_bulk`` ("returned_seconds"), which
can come seconds later, when the server closes the stream; ``subscribe`` reads offsets
[0, N) of partition 0 with ``subscribe(start_offset=0)``. The timed section
excludes interpreter start-up, imports and the first connection.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, cast

from gufo.liftbridge.client import LiftbridgeClient
from gufo.liftbridge.types import AckPolicy

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14 and 15)


class Meter:
    """Wall-clock and CPU seconds of this process and the server between start() and stop()."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.wall = self.cpu = self.server_cpu = 0.0

    def start(self) -> None:
        self.server_cpu = -process_cpu_seconds(self.server_pid)
        self.cpu = -time.process_time()
        self.wall = -time.perf_counter()

    def stop(self) -> None:
        self.wall += time.perf_counter()
        self.cpu += time.process_time()
        self.server_cpu += process_cpu_seconds(self.server_pid)


async def publish(args: argparse.Namespace) -> dict[str, Any]:
    value = os.urandom(args.size)
    acks = errors = 0
    meter = Meter(args.server_pid)
    async with LiftbridgeClient([args.broker]) as client:
        await client.get_metadata()  # connect (and learn leaders) outside the timed section
        requests = (
            client.get_publish_request(value, stream=args.stream, partition=0, ack_policy=AckPolicy.LEADER)
            for _ in range(args.messages)
        )
        meter.start()
        started = time.perf_counter()
        async for response in client.publish_bulk(requests, wait=True):
            if response.HasField("asyncError"):
                errors += 1
            else:
                acks += 1
            if acks + errors == args.messages:
                meter.stop()  # the last ack: publish_bulk itself may return later (see "returned_seconds")
        returned = time.perf_counter() - started
        if acks + errors < args.messages:
            meter.stop()
    return {
        "messages": args.messages,
        "acks": acks,
        "errors": errors,
        "bytes": args.messages * args.size,
        "seconds": meter.wall,
        "returned_seconds": returned,
        "client_cpu": meter.cpu,
        "server_cpu": meter.server_cpu,
    }


async def subscribe(args: argparse.Namespace) -> dict[str, Any]:
    count = nbytes = 0
    last = args.messages - 1
    meter = Meter(args.server_pid)
    async with LiftbridgeClient([args.broker]) as client:
        await client.get_metadata()  # learn the leader outside the timed section
        meter.start()
        # gufo's subscribe has no stop position: stop after offset N - 1 and close the generator.
        subscription = cast(AsyncGenerator[Any, None], client.subscribe(args.stream, partition=0, start_offset=0))
        async with aclosing(subscription) as messages:
            async for message in messages:
                count += 1
                nbytes += len(message.value)
                if message.offset >= last:
                    break
        meter.stop()
    return {
        "messages": count,
        "bytes": nbytes,
        "seconds": meter.wall,
        "client_cpu": meter.cpu,
        "server_cpu": meter.server_cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["publish", "subscribe"])
    parser.add_argument("--broker", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--messages", type=int, required=True)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--server-pid", type=int, required=True)
    args = parser.parse_args()
    run = publish if args.mode == "publish" else subscribe
    print(json.dumps(asyncio.run(run(args))), flush=True)


if __name__ == "__main__":
    main()
