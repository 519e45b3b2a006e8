"""Throughput of the Python Liftbridge client against a real single-node server, next to go-liftbridge and gufo.

    .venv/bin/python bench/bench_client.py [--messages 100000] [--repeat 3] [--no-gufo] [--no-go]
                                           [--chart docs/benchmarks-client.png]

Starts one Liftbridge node on 127.0.0.1 (``liftbridge_provider.devserver``),
then measures, each publish test on a fresh single-partition stream:

- ``publish`` in a loop (one unary call per message, waits for each ack): the sync loop;
- ``publish_batch`` at several windows over gRPC (pipelined over PublishAsync), and at
  ``--nats-window`` (default 1024) over NATS (a second client configured with the server's
  NATS URL: envelopes straight to the partition's subject; its NATS connect is timed, as it
  is part of every call);
- gufo-liftbridge ``publish_bulk`` with as many messages (in a subprocess, see ``_gufo_worker.py``),
  timed to its last ack (it returns seconds later, when the server closes the stream; printed apart);
- ``read_range`` of the messages of one publish_batch stream (``--read-window``, default the largest
  window), and gufo ``subscribe`` reading the same range;
- the go-liftbridge reference (``golbbench``, tools/golbbench, built by ``make golbbench``;
  subprocesses, connect not timed): ``PublishAsync`` with ``--go-window`` (default 1024) acks
  outstanding, ``Publish`` in a loop (sync, as many messages as the sync loop) and ``Subscribe``
  reading the same range as read_range.

"vs go" divides msgs/s by go-liftbridge's: publish tests by go PublishAsync, the sync
loop by go's sync Publish loop, reads by go Subscribe. The sync loops' ack latencies
(p50/p99/max, computed the same way) are printed side by side.

gufo-liftbridge 0.2.0 must be installed in the same interpreter (``pip install
gufo-liftbridge==0.2.0``); without it the gufo tests are skipped. Without the golbbench
binary the go tests are skipped, with a notice.

Payload values are random, ``--size`` bytes (default 256); MB/s counts
payload bytes (1 MB = 10^6 bytes). Ack policy LEADER. CPU seconds come from
``time.process_time()`` (client, all threads; the Go process's own rusage for go tests)
and /proc/<pid>/stat (server); "machine %" is (client + server CPU) / (wall seconds x CPUs).
With ``--repeat N`` (default 3) every test runs N times (interleaved) and the table
shows the run with the median msgs/s (``--pick best`` shows the fastest
instead) and the min..max msgs/s of all runs. ``--chart PATH`` writes a PNG bar chart of
the shown runs. About 3 minutes with the defaults on 2 CPUs.

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

from _chart import Bar, write_chart
from _golbbench import find_golbbench, go_liftbridge_version, run_golbbench
from _machine import cpu_model, load_average, machine_line

from liftbridge_provider.client import ClientConfig, LiftbridgeClient, LiftbridgeError, NatsConfig
from liftbridge_provider.devserver import DevServer, start_single
from liftbridge_provider.devserver.binaries import liftbridge_binary, liftbridge_version

WORKER = Path(__file__).with_name("_gufo_worker.py")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SYNC = "publish (sync loop)"
GUFO_PUBLISH = "gufo publish_bulk"
READ = "read_range"
GUFO_READ = "gufo subscribe"
GO_SYNC = "go Publish (sync loop)"
GO_READ = "go Subscribe"
NAME_WIDTH = 26


def batch_name(window: int) -> str:
    return f"publish_batch w={window}"


def nats_batch_name(window: int) -> str:
    return f"publish_batch NATS w={window}"


def go_async_name(window: int) -> str:
    return f"go PublishAsync w={window}"


def is_go(name: str) -> bool:
    return name.startswith("go ")


def is_read(name: str) -> bool:
    return name in (READ, GUFO_READ, GO_READ)


def is_sync(name: str) -> bool:
    return name in (SYNC, GO_SYNC)


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
    latency_ms: tuple[float, float, float] | None = None  # p50, p99, max of the sync loops

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
    def __init__(
        self,
        server: DevServer,
        client: LiftbridgeClient,
        nats_client: LiftbridgeClient,
        golbbench: Path | None,
        args: argparse.Namespace,
    ) -> None:
        pid = server.nodes[0].process.pid
        assert pid is not None, "the server has no pid"
        self.server_pid = pid
        self.broker = server.brokers[0]
        self.client = client
        self.nats_client = nats_client
        self.golbbench = golbbench
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
        q = statistics.quantiles(latencies, n=100, method="inclusive")  # as golbbench: never above the max
        run.latency_ms = (q[49] * 1e3, q[98] * 1e3, max(latencies) * 1e3)
        self.check_stored(run, stream, count)
        self.client.delete_stream(stream)
        return run

    def batch(self, window: int, keep: bool, over_nats: bool = False) -> tuple[Run, str]:
        count = self.args.messages
        stream = self.fresh_stream(f"{'nats-' if over_nats else ''}w{window}")
        client = self.nats_client if over_nats else self.client
        name = nats_batch_name(window) if over_nats else batch_name(window)
        values = [self.value] * count
        meter = Meter(self.server_pid)
        with meter.measure():
            result = client.publish_batch(stream, values, window=window, ack_policy="leader", raise_on_error=False)
        run = Run(name, count, count * len(self.value), meter.seconds, meter.client_cpu, meter.server_cpu)
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

    def go(self, command: str, stream: str | None = None) -> Run | None:
        """go-liftbridge ``publish-sync``/``publish-async`` (fresh stream) or ``subscribe`` (``stream``); None
        if golbbench printed no result."""
        assert self.golbbench is not None
        args = self.args
        target = self.fresh_stream(f"go-{command}") if stream is None else stream
        options: dict[str, object] = {"brokers": self.broker, "stream": target, "server-pid": self.server_pid}
        if command == "publish-sync":
            name, count = GO_SYNC, args.sync_messages
            options.update(messages=count, size=args.size)
        elif command == "publish-async":
            name, count = go_async_name(args.go_window), args.messages
            options.update(messages=count, size=args.size, window=args.go_window)
        else:
            name, count = GO_READ, args.messages
            options.update(partition=0, count=count)
        outcome = run_golbbench(self.golbbench, command, options)
        data = outcome.data
        if data is not None:
            run = Run(name, data["messages"], data["bytes"], data["seconds"], data["client_cpu"], data["server_cpu"])
            if outcome.problem is not None:
                run.problems.append(outcome.problem)
            elif data["messages"] != count:
                run.problems.append(f"{data['messages']} messages, expected {count}")
            if "p50_us" in data:
                run.latency_ms = (data["p50_us"] / 1e3, data["p99_us"] / 1e3, data["max_us"] / 1e3)
            if stream is None:
                self.check_stored(run, target, count)
        if stream is None:
            self.client.delete_stream(target)
        return run if data is not None else None


# -- reporting ----------------------------------------------------------------------


def pick(runs: list[Run], how: str) -> Run:
    """The run with the median (lower median for even N) or the best msgs/s."""
    ordered = sorted(runs, key=lambda r: r.rate)
    return ordered[-1] if how == "best" else ordered[(len(ordered) - 1) // 2]


def ratio(run: Run, reference: Run | None) -> str:
    if reference is None or reference.rate == 0:
        return ""
    return f"{run.rate / reference.rate:.2f}x"


def display_order(chosen: dict[str, Run], args: argparse.Namespace) -> list[str]:
    """Tests grouped: sync loops, then publishing, then reading; the go reference first in each group."""
    names = [GO_SYNC, SYNC, go_async_name(args.go_window)]
    names += [batch_name(w) for w in args.window_list] + [nats_batch_name(args.nats_window), GUFO_PUBLISH]
    names += [GO_READ, READ, GUFO_READ]
    return [name for name in names if name in chosen] + [name for name in chosen if name not in names]


def go_reference(name: str, chosen: dict[str, Run], args: argparse.Namespace) -> Run | None:
    """The go-liftbridge run a test is compared with (None for the go runs themselves)."""
    if is_go(name):
        return None
    if is_sync(name):
        return chosen.get(GO_SYNC)
    if is_read(name):
        return chosen.get(GO_READ)
    return chosen.get(go_async_name(args.go_window))


def print_table(chosen: dict[str, Run], all_runs: dict[str, list[Run]], args: argparse.Namespace) -> None:
    cpus = os.cpu_count() or 1
    sync = chosen.get(SYNC)
    gufo_publish, gufo_read = chosen.get(GUFO_PUBLISH), chosen.get(GUFO_READ)
    header = (
        f"{'test':<{NAME_WIDTH}} {'messages':>9} {'seconds':>8} {'msgs/s':>9} {'MB/s':>7} {'vs go':>6}"
        f" {'vs sync':>8} {'vs gufo':>8} {'client CPU s':>12} {'server CPU s':>12} {'machine %':>9}"
    )
    if args.repeat > 1:
        header += f"  {'msgs/s min..max':>17}"
    print(header)
    print("-" * len(header))
    for name in display_order(chosen, args):
        run = chosen[name]
        other = is_go(name) or name.startswith("gufo")
        versus_go = "ref" if is_go(name) else ratio(run, go_reference(name, chosen, args))
        versus_sync = "" if is_read(name) or is_sync(name) or is_go(name) else ratio(run, sync)
        versus_gufo = "" if other or is_sync(name) else ratio(run, gufo_read if is_read(name) else gufo_publish)
        busy = 100 * (run.client_cpu + run.server_cpu) / (run.seconds * cpus) if run.seconds > 0 else 0.0
        line = (
            f"{name:<{NAME_WIDTH}} {run.messages:>9} {run.seconds:>8.2f} {run.rate:>9.0f} {run.mb_per_s:>7.2f}"
            f" {versus_go:>6} {versus_sync:>8} {versus_gufo:>8} {run.client_cpu:>12.2f} {run.server_cpu:>12.2f}"
            f" {busy:>8.0f}%"
        )
        if args.repeat > 1:
            rates = [r.rate for r in all_runs[name]]
            spread = f"{min(rates):.0f}..{max(rates):.0f}"
            line += f"  {spread:>17}"
        print(line)


def print_latencies(chosen: dict[str, Run]) -> None:
    loops = [run for name in (SYNC, GO_SYNC) if (run := chosen.get(name)) is not None and run.latency_ms]
    if not loops:
        return
    print(f"{'sync publish ack latency':<{NAME_WIDTH}} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'messages':>9}")
    for run in loops:
        assert run.latency_ms is not None
        p50, p99, worst = run.latency_ms
        print(f"{run.name:<{NAME_WIDTH}} {p50:>8.3f} {p99:>8.3f} {worst:>8.3f} {run.messages:>9}")


def print_summary(chosen: dict[str, Run], args: argparse.Namespace) -> None:
    batches = [chosen[batch_name(w)] for w in args.window_list if batch_name(w) in chosen]
    gufo_publish, gufo_read, read = chosen.get(GUFO_PUBLISH), chosen.get(GUFO_READ), chosen.get(READ)
    go_async, go_read = chosen.get(go_async_name(args.go_window)), chosen.get(GO_READ)
    over_nats = chosen.get(nats_batch_name(args.nats_window))
    if batches:
        best = max(batches, key=lambda r: r.rate)
        window = best.name.split("=")[1]
        line = f"best publish_batch window over gRPC: {window} ({best.rate:.0f} msgs/s)"
        if go_async is not None:
            line += f"; / go PublishAsync {best.rate / go_async.rate:.2f}"
        if gufo_publish is not None:
            line += f"; / gufo publish_bulk {best.rate / gufo_publish.rate:.2f}"
        print(line)
    if over_nats is not None:
        line = f"publish_batch over NATS: {over_nats.rate:.0f} msgs/s"
        if batches:
            line += f", {over_nats.rate / max(b.rate for b in batches):.2f}x the best gRPC window"
        if go_async is not None:
            line += f", {over_nats.rate / go_async.rate:.2f}x go PublishAsync"
        print(line + " (its NATS connect is timed: every call opens one)")
    for run in chosen.values():
        for note in run.notes:
            print(f"{run.name}: {note}")
    if read is not None:
        versus = ""
        if go_read is not None:
            versus += f"; go Subscribe {go_read.rate:.0f} msgs/s, ratio {read.rate / go_read.rate:.2f}"
        if gufo_read is not None:
            versus += f"; gufo subscribe {gufo_read.rate:.0f} msgs/s, ratio {read.rate / gufo_read.rate:.2f}"
        print(f"read_range msgs/s: {read.rate:.0f} ({read.mb_per_s:.2f} MB/s){versus}")


def chart(path: Path, chosen: dict[str, Run], args: argparse.Namespace, loads: tuple[float, float]) -> None:
    bars = []
    previous_group = ""
    for name in display_order(chosen, args):
        run = chosen[name]
        group = "sync" if is_sync(name) else "read" if is_read(name) else "publish"
        kind = "go" if is_go(name) else "gufo" if name.startswith("gufo") else "python"
        reference = go_reference(name, chosen, args)
        note = "go reference" if is_go(name) else f"{ratio(run, reference)} go" if reference is not None else ""
        bars.append(Bar(name, run.rate, kind, note, group_start=group != previous_group))
        previous_group = group
    title = (
        f"Liftbridge client msgs/s: {cpu_model()}, {os.cpu_count()} CPUs, "
        f"1-min load average {loads[0]:.2f} at start / {loads[1]:.2f} at end"
    )
    subtitle = (
        f"{server_version()} single node on 127.0.0.1, same run; {args.size}-byte values, ack LEADER, one partition; "
        f"{args.messages} messages per test ({args.sync_messages} for sync loops); "
        f"{args.pick} of {args.repeat} run(s); {time.strftime('%Y-%m-%d')}"
    )
    write_chart(path, bars, title, subtitle)
    print(f"chart written to {path}")


def server_version() -> str:
    try:
        return f"Liftbridge {liftbridge_version(liftbridge_binary())}"
    except Exception as exc:  # only for the header line
        return f"Liftbridge unknown ({exc})"


def versions() -> str:
    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    return (
        f"{server_version()}, single node on 127.0.0.1 | "
        f"Python {platform.python_version()}, grpcio {version('grpcio')}, protobuf {version('protobuf')}, "
        f"nats-py {version('nats-py')} | gufo-liftbridge {version('gufo-liftbridge')} | "
        f"go-liftbridge {go_liftbridge_version()} (golbbench)"
    )


# -- main -------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000, help="messages per batch/gufo/go/read test (100000)")
    parser.add_argument("--sync-messages", type=int, default=3_000, help="messages of the sync publish loops (3000)")
    parser.add_argument(
        "--windows", default="64,256,1024,4096", help="publish_batch windows over gRPC (64,256,1024,4096)"
    )
    parser.add_argument("--nats-window", type=int, default=1024, help="publish_batch window over NATS (1024)")
    parser.add_argument("--go-window", type=int, default=1024, help="go PublishAsync acks outstanding (1024)")
    parser.add_argument("--size", type=int, default=256, help="value size in bytes (256)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of every test, interleaved (3)")
    parser.add_argument("--pick", choices=["median", "best"], default="median", help="run shown per test (median)")
    parser.add_argument("--read-window", type=int, default=None, help="window whose stream read_range reads (largest)")
    parser.add_argument("--no-gufo", action="store_true", help="skip the gufo-liftbridge measurements")
    parser.add_argument("--no-go", action="store_true", help="skip the go-liftbridge (golbbench) measurements")
    parser.add_argument("--chart", type=Path, default=None, metavar="PATH", help="write a PNG bar chart of the run")
    args = parser.parse_args(argv)
    args.window_list = [int(w) for w in args.windows.split(",") if w.strip()]
    if not args.window_list or min(args.window_list) < 1 or args.messages < 1 or args.sync_messages < 2:
        parser.error("windows must be >= 1, --messages >= 1, --sync-messages >= 2")
    if min(args.nats_window, args.go_window) < 1:
        parser.error("--nats-window and --go-window must be >= 1")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    if args.read_window is None:
        args.read_window = args.window_list[-1]
    elif args.read_window not in args.window_list:
        parser.error("--read-window must be one of --windows")
    return args


def run_all(bench: Bench, args: argparse.Namespace, progress: Callable[[Run], None]) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = defaultdict(list)
    go = bench.golbbench is not None

    def record(run: Run | None) -> None:
        if run is not None:
            runs[run.name].append(run)
            progress(run)

    for _ in range(args.repeat):
        if go:
            record(bench.go("publish-sync"))
        record(bench.sync_loop())
        if go:
            record(bench.go("publish-async"))
        read_stream = None
        for window in args.window_list:
            run, stream = bench.batch(window, keep=window == args.read_window)
            record(run)
            if window == args.read_window:
                read_stream = stream
        record(bench.batch(args.nats_window, keep=False, over_nats=True)[0])
        if not args.no_gufo:
            record(bench.gufo("publish"))
        assert read_stream is not None
        if go:
            record(bench.go("subscribe", read_stream))
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
    golbbench = None if args.no_go else find_golbbench()
    print(versions())
    print(machine_line())
    load_at_start = load_average()[0]
    print(
        f"{args.size}-byte values, ack policy LEADER, one partition; "
        f"{args.messages} messages per batch/gufo/go/read test, "
        f"{args.sync_messages} for the sync loops; {args.repeat} run(s) per test, showing the "
        f"{'median' if args.pick == 'median' else 'best'} msgs/s"
    )
    started = time.perf_counter()

    def progress(run: Run) -> None:
        note = f"  !! {'; '.join(run.problems)}" if run.problems else ""
        print(
            f"  .. {run.name:<{NAME_WIDTH}} {run.seconds:7.2f} s {run.rate:9.0f} msgs/s{note}",
            file=sys.stderr,
            flush=True,
        )

    with start_single() as server:
        nats = NatsConfig(servers=tuple(server.nats_servers))
        with (
            LiftbridgeClient(server.brokers) as client,
            LiftbridgeClient(ClientConfig(brokers=tuple(server.brokers), nats=nats)) as nats_client,
        ):
            runs = run_all(Bench(server, client, nats_client, golbbench, args), args, progress)
    load_at_end = load_average()[0]
    chosen = {name: pick(group, args.pick) for name, group in runs.items()}
    print()
    print_table(chosen, runs, args)
    print()
    print_latencies(chosen)
    print()
    print_summary(chosen, args)
    print(f"1-minute load average: {load_at_start:.2f} at start, {load_at_end:.2f} at end")
    problems = [f"{r.name}: {p}" for group in runs.values() for r in group for p in r.problems]
    expected_tests = 1 + len(args.window_list) + 1 + 1 + (0 if args.no_gufo else 2) + (0 if golbbench is None else 3)
    if len(runs) < expected_tests:
        problems.append(f"only {len(runs)} of {expected_tests} tests produced a result (see stderr)")
    if args.chart is not None and chosen:
        chart(args.chart, chosen, args, (load_at_start, load_at_end))
    for problem in problems:
        print(f"PROBLEM {problem}")
    print(f"total wall time {time.perf_counter() - started:.0f} s (including server start-up)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
