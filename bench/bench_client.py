"""Throughput of the Python Liftbridge client against a real single-node server, next to gufo-liftbridge.

    .venv/bin/python bench/bench_client.py [--messages 100000] [--repeat 3] [--no-gufo]

Starts one Liftbridge node on 127.0.0.1 (``liftbridge_provider.devserver``),
then measures, each publish test on a fresh single-partition stream:

- ``publish`` in a loop (one unary call per message, waits for each ack): the baseline;
- ``publish_batch`` at several windows (pipelined over PublishAsync);
- gufo-liftbridge ``publish_bulk`` with as many messages (in a subprocess, see ``_gufo_worker.py``),
  timed to its last ack (it returns seconds later, when the server closes the stream; printed apart);
- ``read_range`` of the messages of one publish_batch stream (``--read-window``, default the largest
  window), and gufo ``subscribe`` reading the same range.

gufo-liftbridge 0.2.0 must be installed in the same interpreter (``pip install
gufo-liftbridge==0.2.0``); without it the gufo tests are skipped.

Payload values are random, ``--size`` bytes (default 256); MB/s counts
payload bytes (1 MB = 10^6 bytes). Ack policy LEADER. CPU seconds come from
``time.process_time()`` (client, all threads) and /proc/<pid>/stat (server);
"machine %" is (client + server CPU) / (wall seconds x CPUs). With
``--repeat N`` (default 3) every test runs N times (interleaved) and the table
shows the run with the median msgs/s (``--pick best`` shows the fastest
instead) and the min..max msgs/s of all runs. About 2.5 minutes with the
defaults on 2 CPUs.

This is a benchmark, not a test: it prints numbers and asserts nothing about time.
It reports (and exits 1 on) wrong results: failed acks, missing messages.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from liftbridge_provider.client import LiftbridgeClient, LiftbridgeError
from liftbridge_provider.devserver import DevServer, start_single
from liftbridge_provider.devserver.binaries import liftbridge_binary, liftbridge_version

WORKER = Path(__file__).with_name("_gufo_worker.py")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SYNC = "publish (sync loop)"
GUFO_PUBLISH = "gufo publish_bulk"
READ = "read_range"
GUFO_READ = "gufo subscribe"


def batch_name(window: int) -> str:
    return f"publish_batch w={window}"


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14 and 15)


@dataclass
class Run:
    """One measured run of one test."""

    name: str
    messages: int
    nbytes: int
    seconds: float
    client_cpu: float
    server_cpu: float
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # seconds per message (sync loop only)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / self.seconds / 1e6 if self.seconds > 0 else 0.0


@dataclass
class Meter:
    """Wall-clock seconds, this process's CPU seconds and the server's CPU seconds of a ``with`` block."""

    server_pid: int
    seconds: float = 0.0
    client_cpu: float = 0.0
    server_cpu: float = 0.0

    @contextmanager
    def measure(self) -> Iterator[None]:
        server0, cpu0, wall0 = process_cpu_seconds(self.server_pid), time.process_time(), time.perf_counter()
        yield
        self.seconds = time.perf_counter() - wall0
        self.client_cpu = time.process_time() - cpu0
        self.server_cpu = process_cpu_seconds(self.server_pid) - server0


class Bench:
    def __init__(self, server: DevServer, client: LiftbridgeClient, args: argparse.Namespace) -> None:
        pid = server.nodes[0].process.pid
        assert pid is not None, "the server has no pid"
        self.server_pid = pid
        self.broker = server.brokers[0]
        self.client = client
        self.args = args
        self.value = os.urandom(args.size)
        self.streams = 0

    # -- streams ----------------------------------------------------------------

    def fresh_stream(self, label: str) -> str:
        self.streams += 1
        name = f"bench-{self.streams}-{label}"
        self.client.create_stream(name, name, partitions=1)
        deadline = time.monotonic() + 10
        while True:  # the partition leader may need a moment after CreateStream returns
            try:
                self.client.fetch_partition_metadata(name, 0)
                return name
            except LiftbridgeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def check_stored(self, run: Run, stream: str, expected: int) -> None:
        high_watermark = self.client.fetch_partition_metadata(stream, 0).high_watermark
        if high_watermark != expected - 1:
            run.problems.append(f"high watermark {high_watermark}, expected {expected - 1}")

    # -- tests --------------------------------------------------------------------

    def sync_loop(self) -> Run:
        count = self.args.sync_messages
        stream = self.fresh_stream("sync")
        latencies = [0.0] * count
        meter = Meter(self.server_pid)
        publish, value, clock = self.client.publish, self.value, time.perf_counter
        with meter.measure():
            for i in range(count):
                sent = clock()
                publish(stream, value, partition=0, ack_policy="leader")
                latencies[i] = clock() - sent
        run = Run(SYNC, count, count * len(value), meter.seconds, meter.client_cpu, meter.server_cpu)
        run.latencies = latencies
        self.check_stored(run, stream, count)
        self.client.delete_stream(stream)
        return run

    def batch(self, window: int, keep: bool) -> tuple[Run, str]:
        count = self.args.messages
        stream = self.fresh_stream(f"w{window}")
        values = [self.value] * count
        meter = Meter(self.server_pid)
        with meter.measure():
            result = self.client.publish_batch(stream, values, window=window, ack_policy="leader", raise_on_error=False)
        run = Run(batch_name(window), count, count * len(self.value), meter.seconds, meter.client_cpu, meter.server_cpu)
        if result.failures:
            first = result.failures[0]
            run.problems.append(f"{len(result.failures)} failures, first #{first.index}: {first.error}")
        offsets = [a.offset for a in result.acks if a is not None]
        if offsets != list(range(count)):
            run.problems.append(f"{len(offsets)} acks, offsets not 0..{count - 1} in order")
        self.check_stored(run, stream, count)
        if not keep:
            self.client.delete_stream(stream)
        return run, stream

    def read_range(self, stream: str) -> Run:
        count = self.args.messages
        meter = Meter(self.server_pid)
        received = nbytes = 0
        expected = 0
        in_order = True
        with meter.measure():
            for message in self.client.read_range(stream, 0, 0, count):
                in_order = in_order and message.offset == expected
                expected += 1
                received += 1
                nbytes += len(message.value)
        run = Run(READ, received, nbytes, meter.seconds, meter.client_cpu, meter.server_cpu)
        if received != count or not in_order:
            run.problems.append(f"read {received} messages (in order: {in_order}), expected {count}")
        return run

    def gufo(self, mode: str, stream: str | None = None) -> Run | None:
        """gufo publish_bulk (fresh stream) or subscribe (``stream``) in a subprocess; None if it failed."""
        count = self.args.messages
        fresh = stream is None
        target = self.fresh_stream("gufo") if stream is None else stream
        argv = [sys.executable, str(WORKER), mode, "--broker", self.broker, "--stream", target]
        argv += ["--messages", str(count), "--size", str(self.args.size), "--server-pid", str(self.server_pid)]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        except subprocess.TimeoutExpired:
            print(f"!! gufo {mode} worker timed out after 600 s", file=sys.stderr)
            return None
        if done.returncode != 0 or not done.stdout.strip():
            print(f"!! gufo {mode} worker failed (exit {done.returncode}):\n{done.stderr[-3000:]}", file=sys.stderr)
            return None
        data = json.loads(done.stdout.strip().splitlines()[-1])
        name = GUFO_PUBLISH if mode == "publish" else GUFO_READ
        run = Run(name, data["messages"], data["bytes"], data["seconds"], data["client_cpu"], data["server_cpu"])
        if mode == "publish":
            tail = data["returned_seconds"] - data["seconds"]
            run.notes.append(f"publish_bulk returned {tail:.2f} s after the last ack (not counted above)")
            if data["errors"] or data["acks"] != count:
                run.problems.append(f"{data['acks']} acks, {data['errors']} errors, expected {count} acks")
            self.check_stored(run, target, count)
        elif data["messages"] != count:
            run.problems.append(f"read {data['messages']} messages, expected {count}")
        if fresh:
            self.client.delete_stream(target)
        return run


# -- reporting ----------------------------------------------------------------------


def pick(runs: list[Run], how: str) -> Run:
    """The run with the median (lower median for even N) or the best msgs/s."""
    ordered = sorted(runs, key=lambda r: r.rate)
    return ordered[-1] if how == "best" else ordered[(len(ordered) - 1) // 2]


def ratio(run: Run, reference: Run | None) -> str:
    if reference is None or reference.rate == 0:
        return ""
    return f"{run.rate / reference.rate:.2f}x"


def print_table(chosen: dict[str, Run], all_runs: dict[str, list[Run]], repeat: int) -> None:
    cpus = os.cpu_count() or 1
    sync = chosen.get(SYNC)
    gufo_publish, gufo_read = chosen.get(GUFO_PUBLISH), chosen.get(GUFO_READ)
    header = (
        f"{'test':<22} {'messages':>9} {'seconds':>8} {'msgs/s':>9} {'MB/s':>7} {'vs sync':>8} {'vs gufo':>8}"
        f" {'client CPU s':>12} {'server CPU s':>12} {'machine %':>9}"
    )
    if repeat > 1:
        header += f"  {'msgs/s min..max':>17}"
    print(header)
    print("-" * len(header))
    for name, run in chosen.items():
        is_read = name in (READ, GUFO_READ)
        versus_sync = "" if is_read or name == SYNC else ratio(run, sync)
        versus_gufo = ratio(run, gufo_read if is_read else gufo_publish) if not name.startswith("gufo") else ""
        busy = 100 * (run.client_cpu + run.server_cpu) / (run.seconds * cpus) if run.seconds > 0 else 0.0
        line = (
            f"{name:<22} {run.messages:>9} {run.seconds:>8.2f} {run.rate:>9.0f} {run.mb_per_s:>7.2f}"
            f" {versus_sync:>8} {versus_gufo:>8} {run.client_cpu:>12.2f} {run.server_cpu:>12.2f} {busy:>8.0f}%"
        )
        if repeat > 1:
            rates = [r.rate for r in all_runs[name]]
            spread = f"{min(rates):.0f}..{max(rates):.0f}"
            line += f"  {spread:>17}"
        print(line)


def print_summary(chosen: dict[str, Run], windows: list[int]) -> None:
    sync = chosen.get(SYNC)
    if sync is not None and sync.latencies:
        q = statistics.quantiles(sync.latencies, n=100)
        print(
            f"sync publish ack latency: p50 {q[49] * 1e3:.3f} ms, p99 {q[98] * 1e3:.3f} ms, "
            f"max {max(sync.latencies) * 1e3:.3f} ms ({len(sync.latencies)} messages)"
        )
    batches = [chosen[batch_name(w)] for w in windows if batch_name(w) in chosen]
    gufo_publish, gufo_read, read = chosen.get(GUFO_PUBLISH), chosen.get(GUFO_READ), chosen.get(READ)
    if batches:
        best = max(batches, key=lambda r: r.rate)
        if gufo_publish is not None:
            print(
                f"ratio publish_batch(best window: {best.name.split('=')[1]}) / gufo publish_bulk: "
                f"{best.rate / gufo_publish.rate:.2f} ({best.rate:.0f} vs {gufo_publish.rate:.0f} msgs/s)"
            )
        else:
            print(f"best publish_batch window: {best.name.split('=')[1]} ({best.rate:.0f} msgs/s); gufo not measured")
    for run in chosen.values():
        for note in run.notes:
            print(f"{run.name}: {note}")
    if read is not None:
        versus = ""
        if gufo_read is not None:
            versus = f"; gufo subscribe {gufo_read.rate:.0f} msgs/s, ratio {read.rate / gufo_read.rate:.2f}"
        print(f"read_range msgs/s: {read.rate:.0f} ({read.mb_per_s:.2f} MB/s){versus}")


def versions() -> str:
    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    try:
        server = liftbridge_version(liftbridge_binary())
    except Exception as exc:  # only for the header line
        server = f"unknown ({exc})"
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"Liftbridge {server}, single node on 127.0.0.1 | {os.cpu_count()} CPUs ({cpu}) | "
        f"Python {platform.python_version()}, grpcio {version('grpcio')}, protobuf {version('protobuf')}, "
        f"gufo-liftbridge {version('gufo-liftbridge')}"
    )


# -- main -------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000, help="messages per batch/gufo/read test (100000)")
    parser.add_argument("--sync-messages", type=int, default=3_000, help="messages of the sync publish loop (3000)")
    parser.add_argument("--windows", default="64,256,1024,4096", help="publish_batch windows (64,256,1024,4096)")
    parser.add_argument("--size", type=int, default=256, help="value size in bytes (256)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of every test, interleaved (3)")
    parser.add_argument("--pick", choices=["median", "best"], default="median", help="run shown per test (median)")
    parser.add_argument("--read-window", type=int, default=None, help="window whose stream read_range reads (largest)")
    parser.add_argument("--no-gufo", action="store_true", help="skip the gufo-liftbridge measurements")
    args = parser.parse_args(argv)
    args.window_list = [int(w) for w in args.windows.split(",") if w.strip()]
    if not args.window_list or min(args.window_list) < 1 or args.messages < 1 or args.sync_messages < 2:
        parser.error("windows must be >= 1, --messages >= 1, --sync-messages >= 2")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    if args.read_window is None:
        args.read_window = args.window_list[-1]
    elif args.read_window not in args.window_list:
        parser.error("--read-window must be one of --windows")
    return args


def run_all(bench: Bench, args: argparse.Namespace, progress: Callable[[Run], None]) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = defaultdict(list)

    def record(run: Run | None) -> None:
        if run is not None:
            runs[run.name].append(run)
            progress(run)

    for _ in range(args.repeat):
        record(bench.sync_loop())
        read_stream = None
        for window in args.window_list:
            run, stream = bench.batch(window, keep=window == args.read_window)
            record(run)
            if window == args.read_window:
                read_stream = stream
        if not args.no_gufo:
            record(bench.gufo("publish"))
        assert read_stream is not None
        record(bench.read_range(read_stream))
        if not args.no_gufo:
            record(bench.gufo("subscribe", read_stream))
        bench.client.delete_stream(read_stream)
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.no_gufo:
        try:
            metadata.version("gufo-liftbridge")
        except metadata.PackageNotFoundError:
            print("gufo-liftbridge is not installed (pip install gufo-liftbridge==0.2.0): skipping its tests")
            args.no_gufo = True
    print(versions())
    print(
        f"{args.size}-byte values, ack policy LEADER, one partition; "
        f"{args.messages} messages per batch/gufo/read test, "
        f"{args.sync_messages} for the sync loop; {args.repeat} run(s) per test, showing the "
        f"{'median' if args.pick == 'median' else 'best'} msgs/s"
    )
    started = time.perf_counter()

    def progress(run: Run) -> None:
        note = f"  !! {'; '.join(run.problems)}" if run.problems else ""
        print(f"  .. {run.name:<22} {run.seconds:7.2f} s {run.rate:9.0f} msgs/s{note}", file=sys.stderr, flush=True)

    with start_single() as server, LiftbridgeClient(server.brokers) as client:
        runs = run_all(Bench(server, client, args), args, progress)
    chosen = {name: pick(group, args.pick) for name, group in runs.items()}
    print()
    print_table(chosen, runs, args.repeat)
    print()
    print_summary(chosen, args.window_list)
    problems = [f"{r.name}: {p}" for group in runs.values() for r in group for p in r.problems]
    expected_tests = 1 + len(args.window_list) + 1 + (0 if args.no_gufo else 2)
    if len(runs) < expected_tests:
        problems.append(f"only {len(runs)} of {expected_tests} tests produced a result (see stderr)")
    for problem in problems:
        print(f"PROBLEM {problem}")
    print(f"total wall time {time.perf_counter() - started:.0f} s (including server start-up)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
