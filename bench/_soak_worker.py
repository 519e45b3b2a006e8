"""The client process of bench_soak.py: a mix of the client's calls on one stream until ``--seconds`` pass.

    .venv/bin/python bench/_soak_worker.py --brokers H:P,H:P,H:P --nats nats://H:P --stream S --seconds 600

Started by bench_soak.py, which owns the cluster and its failovers and reads this process's lines.
Threads of its own (a fixed number, so a change in the thread count is the client's):

- ``publisher``: sync ``publish`` in a loop (the shared PublishAsync stream), ack policy ALL;
- the main thread: a round of ``publish_batch`` over gRPC and over NATS (a second client, given the
  cluster's NATS), ``read_range`` of the newest 300 acked offsets, a ``subscribe`` and a
  ``range_subscription`` each left after 20 messages (their calls closed before the server ends them),
  ``spark/reader.read_slice`` of a slice (``Subscription.column_batches``), ``set_cursor`` then
  ``fetch_cursor``, and the metadata calls (``fetch_metadata``, ``fetch_partition_metadata``,
  ``stream_info``);
- ``sampler``: every ``--sample-every`` seconds one JSON line ``{"sample": ...}``: VmRSS and Threads of
  /proc/self/status, the open fds (/proc/self/fd, by kind), ``threading.active_count()`` and the threads'
  names, and the counts so far. The main thread takes the sample itself at its next gap between two
  calls (``"quiet": true``: none of its calls open then, so what is counted is what stays), unless it is
  inside one call for 2 s more; then the sampler takes it (``"quiet": false``, mostly during failovers).

Every message value is ``<source>:<seq>|<blake2b of that>`` and each acked offset is kept (the newest
10,000, so the books stay one size) with its value. A read that returns a gap, an offset out of order,
a value that is not one of ours, or a value other than the acked one at that offset is wrong data: one
``{"wrong": ...}`` line, and this process ends with exit 1. Errors the client names as transient
(:data:`TRANSIENT`) are counted by operation and kind; any other error is counted as ``unexpected``
(its first text kept), and the loop goes on; a batch's failures count once per message. At the end
the three clients (the plain one, the NATS one, read_slice's task client) are closed and one more
sample is taken (``after_close``), then ``{"done": ...}``.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from liftbridge_provider.client import (
    AckTimeoutError,
    BatchResult,
    BeyondHighWatermarkError,
    LiftbridgeClient,
    LiftbridgeTimeoutError,
    NatsConfig,
    NoMetadataLeaderError,
    NotLeaderError,
    StartPosition,
    UnavailableError,
)
from liftbridge_provider.core.spark_planning import Slice
from liftbridge_provider.spark.options import parse_options
from liftbridge_provider.spark.reader import arrow_schema, read_slice, task_client

TRANSIENT: tuple[type[Exception], ...] = (
    UnavailableError,
    LiftbridgeTimeoutError,  # AckTimeoutError too
    AckTimeoutError,
    BeyondHighWatermarkError,
    NotLeaderError,
    NoMetadataLeaderError,
)
"""What the client's contract (client/errors.py) names as passing: no broker reachable, a deadline, an ack
that did not come, a high watermark that lags after a failover, a leader or metadata leader being elected."""

KEPT_ACKS = 10_000
READ_SPAN = 300
CURSOR = "soak-cursor"


class WrongData(Exception):
    """A read returned what was not written there."""


def value_of(source: str, seq: int) -> bytes:
    head = f"{source}:{seq}".encode()
    return head + b"|" + hashlib.blake2b(head, digest_size=12).hexdigest().encode()


def well_formed(value: bytes) -> bool:
    head, bar, digest = value.rpartition(b"|")
    return bool(bar) and hashlib.blake2b(head, digest_size=12).hexdigest().encode() == digest


class Books:
    """Counts and the newest acked offsets, shared by the threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ops: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.unexpected: dict[str, str] = {}
        self.acked: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self.newest = -1

    def count(self, op: str, n: int = 1) -> None:
        with self.lock:
            self.ops[op] += n

    def ack(self, offset: int, value: bytes) -> None:
        with self.lock:
            known = self.acked.get(offset)
            if known is not None and known != value:
                raise WrongData(f"offset {offset} acked twice: {known!r} and {value!r}")
            self.acked[offset] = value
            while len(self.acked) > KEPT_ACKS:
                self.acked.popitem(last=False)
            self.newest = max(self.newest, offset)

    def failed(self, op: str, exc: BaseException) -> None:
        kind = type(exc).__name__
        with self.lock:
            if isinstance(exc, TRANSIENT):
                self.errors[f"{op}: {kind}"] += 1
            else:
                key = f"{op}: {kind}"
                self.errors[f"unexpected {key}"] += 1
                if key not in self.unexpected:
                    self.unexpected[key] = "".join(traceback.format_exception(exc))[-1500:]

    def check(self, op: str, start: int, pairs: Iterable[tuple[int, bytes]]) -> int:
        """Offsets from ``start`` on without a gap, every value ours, each acked one as acked."""
        expected = start
        for offset, value in pairs:
            if offset != expected:
                raise WrongData(f"{op}: offset {offset}, expected {expected} (read from {start})")
            if not well_formed(value):
                raise WrongData(f"{op}: offset {offset} holds {value[:80]!r}, not a value this bench wrote")
            with self.lock:
                known = self.acked.get(offset)
            if known is not None and known != value:
                raise WrongData(f"{op}: offset {offset} holds {value!r}, acked as {known!r}")
            expected += 1
        return expected - start

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"ops": dict(self.ops), "errors": dict(self.errors)}


def fd_kinds() -> dict[str, int]:
    kinds: collections.Counter[str] = collections.Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile, or the listing's own fd
            continue
        kind = target.split(":", 1)[0] if ":" in target and not target.startswith("/") else "file"
        kinds[kind.strip("[]")] += 1
    return dict(kinds)


def os_thread_names() -> dict[str, int]:
    """The process's OS threads by name (/proc/self/task/*/comm: grpc's own threads have names but no Python
    thread), so a thread count that moves says whose thread it is."""
    names: collections.Counter[str] = collections.Counter()
    for task in os.listdir("/proc/self/task"):
        try:
            names[Path(f"/proc/self/task/{task}/comm").read_text().strip()] += 1
        except OSError:  # ended meanwhile
            continue
    return dict(sorted(names.items()))


def sample(books: Books, began: float) -> dict[str, Any]:
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    kinds = fd_kinds()
    return {
        "t": round(time.monotonic() - began, 2),
        "thread_names": sorted(thread.name for thread in threading.enumerate()),
        "rss_kb": int(status["VmRSS"].split()[0]),
        "threads_os": int(status["Threads"]),
        "os_thread_names": os_thread_names(),
        "threads_py": threading.active_count(),
        "fds": sum(kinds.values()),
        "fd_kinds": kinds,
        **books.snapshot(),
    }


def emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


class Sampler:
    """A sample every ``every`` seconds, taken by the main thread between two calls when it can."""

    def __init__(self, books: Books, began: float, every: float) -> None:
        self.books, self.began, self.every = books, began, every
        self.lock = threading.Lock()
        self.due = False
        self.taken = threading.Event()
        self.done = threading.Event()

    def offer(self) -> None:
        """The main thread, between two calls: take the sample if one is due."""
        if self.due:
            self.take(quiet=True)

    def take(self, *, quiet: bool) -> None:
        with self.lock:
            if not self.due:
                return
            self.due = False
            emit({"sample": {**sample(self.books, self.began), "quiet": quiet}})
            self.taken.set()

    def run(self) -> None:
        next_at = self.began
        while not self.done.wait(max(next_at - time.monotonic(), 0)):
            with self.lock:
                self.taken.clear()
                self.due = True
            if not self.taken.wait(2.0):
                self.take(quiet=False)
            next_at += self.every


def publisher(client: LiftbridgeClient, stream: str, books: Books, stop: threading.Event, wrong: list[str]) -> None:
    seq = 0
    while not stop.is_set():
        value = value_of("p", seq)
        seq += 1
        try:
            ack = client.publish(stream, value, partition=0, ack_policy="all", timeout=10)
        except Exception as exc:
            books.failed("publish", exc)
            stop.wait(0.2)
            continue
        if ack is None or ack.offset < 0:
            wrong.append(f"publish: ack {ack!r} without an offset")
            stop.set()
            return
        try:
            books.ack(ack.offset, value)
        except WrongData as exc:
            wrong.append(str(exc))
            stop.set()
            return
        books.count("publish")


class Mix:
    """The main thread's round of calls."""

    def __init__(
        self,
        client: LiftbridgeClient,
        nats_client: LiftbridgeClient | None,
        args: argparse.Namespace,
        books: Books,
        sampler: Sampler,
    ) -> None:
        self.client, self.nats_client, self.stream = client, nats_client, args.stream
        self.books, self.sampler = books, sampler
        self.batch_seq = 0
        self.cursor_confirmed = -1
        self.cursor_tried: set[int] = set()
        self.slice_options = parse_options({"brokers": args.brokers, "ranges": "{}", "readTimeout": "15"})
        self.schema = arrow_schema()

    def run(self, op: str, call: Callable[[], None]) -> None:
        try:
            call()
        except WrongData:
            raise
        except Exception as exc:
            self.books.failed(op, exc)
        self.sampler.offer()

    def round(self) -> None:
        self.run("publish_batch grpc", lambda: self.batch(self.client, "g", "publish_batch grpc"))
        if self.nats_client is not None:
            nats_client = self.nats_client
            self.run("publish_batch nats", lambda: self.batch(nats_client, "n", "publish_batch nats"))
        self.run("read_range", self.read_range)
        self.run("subscribe (left early)", self.subscribe)
        self.run("range_subscription (left early)", self.range_subscription)
        self.run("read_slice", self.read_slice)
        self.run("cursor set+fetch", self.cursor)
        self.run("metadata", self.metadata)

    def batch(self, client: LiftbridgeClient, source: str, op: str) -> None:
        values = [value_of(source, self.batch_seq + i) for i in range(200)]
        self.batch_seq += len(values)
        result: BatchResult = client.publish_batch(
            self.stream, values, partition=0, ack_policy="all", window=64, timeout=20, raise_on_error=False
        )
        for value, ack in zip(values, result.acks, strict=True):
            if ack is not None:
                self.books.ack(ack.offset, value)
        for failure in result.failures:
            self.books.failed(op, failure.error)
        self.books.count(op)
        self.books.count(f"{op} messages acked", len(values) - len(result.failures))

    def span(self, length: int) -> tuple[int, int] | None:
        newest = self.books.newest
        if newest < 0:
            return None
        return max(0, newest + 1 - length), newest + 1

    def read_range(self) -> None:
        span = self.span(READ_SPAN)
        if span is None:
            return
        start, end = span
        pairs = ((m.offset, m.value) for m in self.client.read_range(self.stream, 0, start, end, timeout=20))
        read = self.books.check("read_range", start, pairs)
        if read != end - start:
            raise WrongData(f"read_range [{start}, {end}) ended after {read} messages")
        self.books.count("read_range")
        self.books.count("read_range messages", read)

    def subscribe(self) -> None:
        span = self.span(READ_SPAN)
        if span is None:
            return
        start = span[0]
        with self.client.subscribe(
            self.stream, partition=0, start=StartPosition.at_offset(start), timeout=20, resubscribe_wait=10
        ) as subscription:
            pairs = []
            for message in subscription:
                pairs.append((message.offset, message.value))
                if len(pairs) == 20:
                    break
        self.books.check("subscribe", start, pairs)
        self.books.count("subscribe (left early)")

    def range_subscription(self) -> None:
        span = self.span(READ_SPAN)
        if span is None:
            return
        start, end = span
        subscription = self.client.range_subscription(self.stream, 0, start, end, timeout=20)
        if subscription is None:
            return
        with subscription:
            pairs = []
            for message in subscription:
                pairs.append((message.offset, message.value))
                if len(pairs) == 20:
                    break
        self.books.check("range_subscription", start, pairs)
        self.books.count("range_subscription (left early)")

    def read_slice(self) -> None:
        span = self.span(READ_SPAN)
        if span is None:
            return
        start, end = span
        pairs: list[tuple[int, bytes]] = []
        for batch in read_slice(self.slice_options, self.stream, Slice(0, start, end), self.schema):
            offsets = batch.column("offset").to_pylist()
            values = batch.column("value").to_pylist()
            pairs.extend(zip(offsets, values, strict=True))
        read = self.books.check("read_slice", start, pairs)
        if read != end - start:
            raise WrongData(f"read_slice [{start}, {end}) gave {read} rows")
        self.books.count("read_slice")
        self.books.count("read_slice rows", read)

    def cursor(self) -> None:
        offset = self.books.newest
        if offset < 0:
            return
        self.cursor_tried.add(offset)
        self.client.set_cursor(CURSOR, self.stream, 0, offset, timeout=10)
        self.cursor_confirmed, self.cursor_tried = offset, set()
        found = self.client.fetch_cursor(CURSOR, self.stream, 0, timeout=10)
        # A set whose answer was lost may still land: any value tried since the last confirmed one is right.
        if found != self.cursor_confirmed and found not in self.cursor_tried:
            raise WrongData(f"cursor: set to {offset}, fetched {found}")
        self.books.count("cursor set+fetch")

    def metadata(self) -> None:
        self.client.fetch_metadata()
        info = self.client.fetch_partition_metadata(self.stream, 0, timeout=10)
        if info.high_watermark < -1:
            raise WrongData(f"metadata: high watermark {info.high_watermark}")
        self.client.stream_info(self.stream)
        self.books.count("metadata")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--nats", default="")
    parser.add_argument("--stream", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--sample-every", type=float, default=10.0)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between two rounds of the main thread")
    args = parser.parse_args()
    began = time.monotonic()
    brokers = args.brokers.split(",")
    client = LiftbridgeClient(brokers)
    nats_client = LiftbridgeClient(brokers, nats=NatsConfig(servers=(args.nats,))) if args.nats else None
    books = Books()
    sampler = Sampler(books, began, args.sample_every)
    mix = Mix(client, nats_client, args, books, sampler)
    stop, wrong = threading.Event(), list[str]()
    sampling = threading.Thread(target=sampler.run, name="sampler", daemon=True)
    sampling.start()
    publishing = threading.Thread(
        target=publisher, args=(client, args.stream, books, stop, wrong), name="publisher", daemon=True
    )
    publishing.start()
    try:
        while not stop.is_set() and time.monotonic() - began < args.seconds:
            mix.round()
            books.count("rounds")
            if args.pause:
                stop.wait(args.pause)
    except WrongData as exc:
        wrong.append(str(exc))
    finally:
        stop.set()
        publishing.join(timeout=60)
        sampler.done.set()
        sampling.join(timeout=30)
        emit({"sample": sample(books, began), "before_close": True})
        client.close()
        if nats_client is not None:
            nats_client.close()
        task_client(mix.slice_options.config).close()  # the client read_slice made and keeps for the process
        time.sleep(1.0)
        emit({"sample": sample(books, began), "after_close": True})
    emit(
        {
            "done": books.snapshot(),
            "wrong": wrong,
            "unexpected": books.unexpected,
            "publisher_alive": publishing.is_alive(),
        }
    )
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
