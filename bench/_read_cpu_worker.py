"""One reader of bench_read_cpu.py in its own process: reads a range once to warm up, then once measured.

    .venv/bin/python bench/_read_cpu_worker.py read_range|read_slice|receive_only --brokers H:P --stream S --count N

Prints one JSON line: ``messages``, ``seconds``, ``client_cpu`` (user + system CPU seconds of this
whole process, every thread, during the measured read) and ``native`` (the compiled decoder was
used; None for a checkout that has none). ``LIFTBRIDGE_PURE_PYTHON=1`` in the environment picks the
pure-Python decoder.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.spark.options import parse_options
from liftbridge_provider.spark.reader import arrow_schema, read_slice

try:
    from liftbridge_provider.core.spark_planning import Slice
except ModuleNotFoundError:  # a --base checkout from before the pure core (liftbridge_provider/core/)
    from liftbridge_provider.spark.planning import Slice  # type: ignore[import-not-found,no-redef]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def receive_only(client: LiftbridgeClient, address: str, stream: str, count: int) -> int:
    """The floor of a Python reader on the data plane: one Subscribe call to ``address`` (the single node's
    leader) read a socket read at a time, its messages counted as spans (no decoding, no subscription logic)."""
    from liftbridge_provider.client.subscribe_call import SUBSCRIBE, SubscribeCall  # noqa: PLC0415 - not in --base

    request = api.SubscribeRequest(
        stream=stream, partition=0, startPosition=api.OFFSET, startOffset=0, stopPosition=api.STOP_OFFSET
    )
    request.stopOffset = count - 1
    received = 0
    with client._router.pool.blocking_call(address, SUBSCRIBE, timeout=120) as call:
        subscribe = SubscribeCall(call, request)
        subscribe.confirm()
        try:
            for segments in subscribe.reads():
                for _, spans in segments:
                    received += len(spans) // 2
        except grpc.RpcError as exc:  # the server ends a stop offset with RESOURCE_EXHAUSTED
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
    return received


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path", choices=["read_range", "read_slice", "receive_only"])
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--warm-up", type=int, default=20_000)
    args = parser.parse_args()
    with LiftbridgeClient(args.brokers.split(",")) as client:
        if args.path == "read_range":

            def read(count: int) -> int:
                expected = 0
                for message in client.read_range(args.stream, 0, 0, count):
                    if message.offset != expected:
                        raise SystemExit(f"offset {message.offset}, expected {expected}")
                    expected += 1
                return expected
        elif args.path == "receive_only":

            def read(count: int) -> int:
                return receive_only(client, args.brokers.split(",")[0], args.stream, count)
        else:
            options = parse_options({"brokers": args.brokers, "ranges": "{}"})
            schema = arrow_schema()

            def read(count: int) -> int:
                rows = 0
                for batch in read_slice(options, args.stream, Slice(0, 0, count), schema):
                    rows += batch.num_rows
                return rows

        read(min(args.warm_up, args.count))
        cpu0, wall0 = cpu_seconds(), time.perf_counter()
        messages = read(args.count)
        seconds, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
    print(json.dumps({"messages": messages, "seconds": seconds, "client_cpu": cpu, "native": native()}))


def native() -> bool | None:
    """Whether the compiled decoder was used; None for a checkout without one (bench_read_cpu.py --base)."""
    try:
        from liftbridge_provider.client import columns  # noqa: PLC0415 - absent in older checkouts
    except ImportError:
        return None
    return columns.NATIVE


if __name__ == "__main__":
    main()
