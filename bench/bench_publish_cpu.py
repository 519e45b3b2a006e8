"""CPU seconds per published message, client and server, next to go-liftbridge in the same run (issue 29).

    .venv/bin/python bench/bench_publish_cpu.py [--messages 100000] [--sync-messages 3000] [--repeat 5]
                                                [--tests go,grpc,nats,go-sync,sync] [--window 1024]
                                                [--syscalls] [--perf DIR]

Starts one Liftbridge node (``liftbridge_provider.devserver``) and runs the tests interleaved,
``--repeat`` times, each on a fresh one-partition stream, 256-byte values, ack policy LEADER:

- ``go``: go-liftbridge ``PublishAsync`` with ``--window`` acks outstanding (``golbbench``);
- ``grpc``: ``publish_batch`` over gRPC (no NATS configured), window ``--window``;
- ``nats``: ``publish_batch`` over NATS (a client given the server's NATS URL), window ``--window``;
- ``go-sync`` / ``sync``: go-liftbridge ``Publish`` and this client's ``publish`` in a loop (p50 of the ack
  latency too).

CPU per message is user + system seconds of the client process (all threads) and of the server
process over the run, divided by the messages: on a 2-CPU machine shared with other work it moves
far less than msgs/s, which is printed too, with the 1-minute load average at each run.

``--syscalls`` counts the server's system calls during each run (``strace -f -c -p``; slows both
sides, so its CPU figures are not comparable) and prints them per 1,000 messages. ``--perf DIR``
records the server with ``perf record -g`` during the first run of each test into
``DIR/server-<test>.data`` and prints its top functions and the kernel's share.

A benchmark, not a test: it prints numbers and asserts nothing about time; it exits 1 on wrong
results (failed acks, missing messages).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from _golbbench import find_golbbench
from _machine import load_average, machine_line
from bench_client import Bench, Run, versions

from liftbridge_provider.client import ClientConfig, LiftbridgeClient, NatsConfig
from liftbridge_provider.devserver import start_single

TESTS = ("go", "grpc", "nats", "go-sync", "sync")
SYSCALLS_SHOWN = ("read", "write", "writev", "futex", "epoll_pwait", "nanosleep")


@contextmanager
def traced(pid: int, kind: str, target: Path | None) -> Iterator[dict[str, int]]:
    """Syscall counts of ``pid`` while the block runs (``kind`` "strace"), or a perf recording into
    ``target`` (``kind`` "perf"); nothing for ``kind`` "".
    """
    counts: dict[str, int] = {}
    if not kind:
        yield counts
        return
    if kind == "strace":
        output = Path(f"/tmp/bench-publish-strace-{os.getpid()}.txt")
        argv = ["strace", "-f", "-c", "-p", str(pid), "-o", str(output)]
    else:
        assert target is not None
        argv = ["perf", "record", "-F", "1999", "-g", "-p", str(pid), "-o", str(target)]
    tracer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the run starts
    try:
        yield counts
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=60)
        if kind == "strace":
            for line in output.read_text().splitlines():
                words = line.split()
                if len(words) >= 5 and words[-1].isidentifier() and words[3].isdigit():
                    counts[words[-1]] = int(words[3])
            output.unlink()


def perf_summary(data: Path, top: int = 12) -> str:
    """The kernel's share and the top functions (self time) of a ``perf record`` file."""

    def report(*sort: str) -> list[str]:
        argv = ["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", ",".join(sort)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        return [line.rstrip() for line in done.stdout.splitlines() if line.strip() and line.lstrip()[0].isdigit()]

    lines = report("dso")[:3] + ["  top functions:"] + ["  " + line for line in report("sym")[:top]]
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000, help="messages per batch test (100000)")
    parser.add_argument("--sync-messages", type=int, default=3_000, help="messages per sync loop (3000)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of every test, interleaved (5)")
    parser.add_argument("--tests", default=",".join(TESTS), help=f"tests to run ({','.join(TESTS)})")
    parser.add_argument("--window", type=int, default=1024, help="acks outstanding, every batch test (1024)")
    parser.add_argument("--syscalls", action="store_true", help="count the server's system calls (strace)")
    parser.add_argument("--perf", type=Path, default=None, metavar="DIR", help="perf record the server into DIR")
    args = parser.parse_args()
    args.tests = [t for t in args.tests.split(",") if t]
    if not set(args.tests) <= set(TESTS):
        parser.error(f"--tests takes {', '.join(TESTS)}")
    for tool, wanted in (("strace", args.syscalls), ("perf", args.perf is not None)):
        if wanted and shutil.which(tool) is None:
            parser.error(f"{tool} is not installed")
    # Bench's own settings: the go tests use go_window, the batch tests their window argument.
    args.size, args.go_window = 256, args.window
    return args


Results = tuple[dict[str, list[tuple[Run, float]]], dict[str, list[dict[str, int]]], list[str]]


def run_tests(args: argparse.Namespace, golbbench: Path | None) -> Results:
    """Every test ``args.repeat`` times, interleaved: (runs with the load at their start, syscall counts,
    problems)."""
    runs: dict[str, list[tuple[Run, float]]] = defaultdict(list)
    counts: dict[str, list[dict[str, int]]] = defaultdict(list)
    problems: list[str] = []
    with start_single() as server:
        nats = NatsConfig(servers=tuple(server.nats_servers))
        with (
            LiftbridgeClient(server.brokers) as client,
            LiftbridgeClient(ClientConfig(brokers=tuple(server.brokers), nats=nats)) as nats_client,
        ):
            bench = Bench(server, client, nats_client, golbbench, args)
            measures: dict[str, Callable[[], Run | None]] = {
                "go": lambda: bench.go("publish-async"),
                "grpc": lambda: bench.batch(args.window, keep=False)[0],
                "nats": lambda: bench.batch(args.window, keep=False, over_nats=True)[0],
                "go-sync": lambda: bench.go("publish-sync"),
                "sync": bench.sync_loop,
            }
            for repeat in range(args.repeat):
                for test in args.tests:
                    kind = "strace" if args.syscalls else "perf" if args.perf is not None and repeat == 0 else ""
                    target = args.perf / f"server-{test}.data" if args.perf is not None else None
                    load = load_average()[0]
                    with traced(bench.server_pid, kind, target) as syscalls:
                        run = measures[test]()
                    if run is None:
                        problems.append(f"{test}: no result")
                        continue
                    problems += [f"{test}: {p}" for p in run.problems]
                    runs[test].append((run, load))
                    if syscalls:
                        counts[test].append(syscalls)
                    print(f"  .. {row(test, run, load)}", file=sys.stderr, flush=True)
    return runs, counts, problems


def report(args: argparse.Namespace, runs: dict[str, list[tuple[Run, float]]]) -> None:
    print(
        f"{'test':8} {'msgs/s':>9} {'client us/msg':>14} {'server us/msg':>14} {'total':>7} {'vs go CPU':>9}"
        f" {'vs go msgs/s':>12} {'p50 us':>7} {'load':>5}  (median of {args.repeat} by total CPU)"
    )
    chosen = {test: median(group) for test, group in runs.items()}
    for test, (run, load) in chosen.items():
        anchor = chosen.get("go-sync" if test.endswith("sync") else "go")
        total = per_message(run)
        versus_cpu = versus_rate = ""
        if anchor is not None and not test.startswith("go"):
            versus_cpu = f"{total / per_message(anchor[0]):.2f}x"
            versus_rate = f"{run.rate / anchor[0].rate:.2f}x"
        p50 = f"{run.latency_ms[0] * 1e3:.0f}" if run.latency_ms else ""
        client, server = run.client_cpu / run.messages * 1e6, run.server_cpu / run.messages * 1e6
        print(
            f"{test:8} {run.rate:>9.0f} {client:>14.2f} {server:>14.2f} {total:>7.2f} {versus_cpu:>9}"
            f" {versus_rate:>12} {p50:>7} {load:>5.2f}"
        )
    rates = {test: statistics.median(r.rate for r, _ in group) for test, group in runs.items()}
    print("median msgs/s of every run: " + ", ".join(f"{t} {v:.0f}" for t, v in rates.items()))
    p50s = {t: [r.latency_ms[0] for r, _ in runs.get(t, []) if r.latency_ms] for t in ("sync", "go-sync")}
    if p50s["sync"] and p50s["go-sync"]:
        ratio = statistics.median(p50s["sync"]) / statistics.median(p50s["go-sync"])
        print(
            f"sync p50 ms, every run: publish {fmt(p50s['sync'])}; go Publish {fmt(p50s['go-sync'])}; "
            f"ratio of the medians {ratio:.2f}x"
        )


def main() -> int:
    args = parse_args()
    golbbench = find_golbbench()
    if golbbench is None:
        args.tests = [t for t in args.tests if not t.startswith("go")]
    print(versions())
    print(machine_line())
    print(f"{args.messages} messages per batch test, {args.sync_messages} per sync loop, window {args.window}")
    if args.perf is not None:
        args.perf.mkdir(parents=True, exist_ok=True)
    runs, counts, problems = run_tests(args, golbbench)
    print()
    report(args, runs)
    for test, group in counts.items():
        messages = runs[test][0][0].messages
        shown = {name: statistics.median(c.get(name, 0) for c in group) / messages * 1000 for name in SYSCALLS_SHOWN}
        print(f"server syscalls per 1,000 messages, {test}: " + ", ".join(f"{k} {v:.0f}" for k, v in shown.items()))
    if args.perf is not None:
        for test in args.tests:
            data = args.perf / f"server-{test}.data"
            if data.exists():
                print(f"perf of the server during {test} ({data}):\n{perf_summary(data)}")
    print(f"1-minute load average at the end: {load_average()[0]:.2f}")
    for problem in problems:
        print(f"PROBLEM {problem}")
    return 1 if problems else 0


def per_message(run: Run) -> float:
    """Client + server CPU microseconds per message."""
    return (run.client_cpu + run.server_cpu) / run.messages * 1e6


def median(group: list[tuple[Run, float]]) -> tuple[Run, float]:
    ordered = sorted(group, key=lambda pair: per_message(pair[0]))
    return ordered[(len(ordered) - 1) // 2]


def row(test: str, run: Run, load: float) -> str:
    client, server = run.client_cpu / run.messages * 1e6, run.server_cpu / run.messages * 1e6
    p50 = f" p50 {run.latency_ms[0] * 1e3:.0f} us" if run.latency_ms else ""
    return (
        f"{test:8} {run.rate:9.0f} msgs/s  client {client:6.2f} us/msg  server {server:6.2f} us/msg{p50}  "
        f"load {load:.2f}"
    )


def fmt(values: list[float]) -> str:
    return "/".join(f"{v:.3f}" for v in values)


if __name__ == "__main__":
    sys.exit(main())
