"""A soak of reads, publishes and failovers: does the client process keep RSS, fds and threads flat? (issue 49)

    .venv/bin/python bench/bench_soak.py [--minutes 10] [--warm-up 2] [--failover-every 60] [--sample-every 10]
                                         [--pause 0] [--no-nats] [--leak-fds 16] [--leak-threads 16]
                                         [--leak-rss 5]

Starts a 3-node cluster on 127.0.0.1 (the project's devserver: three Liftbridge nodes on one shared
nats-server), creates one stream (one partition, replication factor 3, min ISR 2), and runs one client
process, ``_soak_worker.py``, for ``--minutes``: a publisher thread doing sync ``publish`` (the shared
PublishAsync stream) in a loop, and a main thread doing rounds of ``publish_batch`` over gRPC and over
NATS, ``read_range``, a ``subscribe`` and a ``range_subscription`` left after 20 messages,
``spark/reader.read_slice`` (``Subscription.column_batches``), ``set_cursor`` + ``fetch_cursor`` and the
metadata calls; every publish with ack policy ALL, every read checked against the acked offsets and
values (see the worker's docstring). Meanwhile this process does a failover every ``--failover-every``
seconds, the first 45 s in, none in the last 30 s, alternating:

- ``kill``: SIGKILL the partition's leader, wait 5 s, restart it (same data, same port) and wait until
  the cluster is ready again;
- ``freeze``: SIGSTOP the partition's leader for 5 s, then SIGCONT.

The worker samples itself every ``--sample-every`` seconds: VmRSS and Threads of /proc/self/status,
the count of /proc/self/fd (by kind), ``threading.active_count()``; its main thread takes each sample
between two of its calls when it can, so that a read's own connection is not counted. After the warm-up (the first
``--warm-up`` minutes, which see the first failover), a least-squares line through the samples gives
each figure's slope per minute. The table says, for each, whether it is flat:

- RSS: slope below 1 MB/min after the warm-up;
- fds, OS threads, Python threads: slope below 0.5 per minute after the warm-up (one left behind per
  failover would be 1 per minute), and back to the warm-up level after each failover: the sample just
  before each later failover (about 50 s after the one before it ended), and the last sample, are at
  most the highest sample of the warm-up.

It also prints the operation and error counts, the failovers done, the fds by kind, and the process's
fds and threads after its clients were closed.

A benchmark, not a test: it asserts nothing about time. Exit 1 on wrong data (a read that returned a
gap or a value other than the acked one; errors the client names as transient, such as
UnavailableError, LiftbridgeTimeoutError, AckTimeoutError or BeyondHighWatermarkError, are only
counted) or on a clear leak: fds or OS threads at the end (median of the last three samples) more than
``--leak-fds`` / ``--leak-threads`` (16) above the warm-up's highest, or RSS growing faster than
``--leak-rss`` (5) MB/min after the warm-up. Exit 2 when it could not measure (the worker died or hung,
a node did not come back). Every process it starts (the nodes, NATS, the worker) is stopped on every
way out; the servers and the worker also die with this process (``setpriv --pdeathsig``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _machine import machine_line

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.devserver import DevServer, DevServerError, start_cluster

WORKER = Path(__file__).with_name("_soak_worker.py")
STREAM = "soak"
FIRST_FAILOVER = 45.0
QUIET_END = 30.0
OUTAGE = 5.0

FLAT_RSS_MB_PER_MIN = 1.0
FLAT_COUNT_PER_MIN = 0.5


@dataclass
class Failover:
    kind: str
    node: str
    began: float
    ended: float = 0.0
    problem: str = ""


@dataclass
class Run:
    samples: list[dict[str, Any]] = field(default_factory=list)
    closing: dict[str, dict[str, Any]] = field(default_factory=dict)
    done: dict[str, Any] | None = None
    wrong: list[str] = field(default_factory=list)
    noise: list[str] = field(default_factory=list)


def read_worker(stdout: Any, run: Run) -> None:
    """The worker's JSON lines into ``run``, each sample printed as it comes."""
    for line in stdout:
        try:
            record = json.loads(line)
        except ValueError:
            run.noise.append(line.rstrip())
            continue
        if "sample" in record:
            one = record["sample"]
            if record.get("before_close"):
                run.closing["before close"] = one
            elif record.get("after_close"):
                run.closing["after close"] = one
            else:
                run.samples.append(one)
                ops = one["ops"]
                print(
                    f"  t={one['t']:6.0f}s rss {one['rss_kb'] / 1024:7.1f} MB  fds {one['fds']:3d}  "
                    f"threads {one['threads_os']:3d} os / {one['threads_py']:2d} py  rounds {ops.get('rounds', 0)}  "
                    f"publishes {ops.get('publish', 0)}  errors {sum(one['errors'].values())}"
                    f"{'' if one.get('quiet') else '  (inside a call)'}",
                    flush=True,
                )
        elif "done" in record:
            run.done = record
        elif "wrong" in record:
            run.wrong.append(str(record["wrong"]))


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``(seconds, value)`` points, per minute."""
    if len(points) < 2:
        return 0.0
    xs = [t / 60 for t, _ in points]
    ys = [v for _, v in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / spread if spread else 0.0


METRICS: dict[str, Callable[[dict[str, Any]], float]] = {
    "RSS (MB)": lambda s: s["rss_kb"] / 1024,
    "fds": lambda s: float(s["fds"]),
    "threads (OS)": lambda s: float(s["threads_os"]),
    "threads (Python)": lambda s: float(s["threads_py"]),
}


def settled(samples: list[dict[str, Any]], failovers: list[Failover], warm_up: float) -> list[dict[str, Any]]:
    """The sample just before each failover that starts after the warm-up, and the last sample: each about
    50 s after the failover before it ended."""
    picked = []
    for failover in failovers:
        if failover.began <= warm_up:
            continue
        before = [s for s in samples if s["t"] < failover.began]
        if before and before[-1]["t"] >= warm_up:
            picked.append(before[-1])
    if samples:
        picked.append(samples[-1])
    return picked


def analyse(run: Run, failovers: list[Failover], args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Print the table; return (figures that are not flat, clear leaks)."""
    warm_up = args.warm_up * 60
    early = [s for s in run.samples if s["t"] < warm_up]
    late = [s for s in run.samples if s["t"] >= warm_up]
    if not early or len(late) < 2:
        print(f"too few samples to judge: {len(early)} in the warm-up, {len(late)} after it")
        return ["samples"], []
    checkpoints = settled(run.samples, failovers, warm_up)
    not_flat, leaks = [], []
    print(
        f"\nafter the warm-up ({args.warm_up:g} min): {len(late)} samples, "
        f"t = {late[0]['t']:.0f}..{late[-1]['t']:.0f} s, {sum(1 for s in late if not s.get('quiet'))} of them taken "
        "inside a call of the main thread"
    )
    header = (
        f"{'figure':18s} {'samples':>7s} {'warm-up max':>11s} {'first':>8s} {'last':>8s} {'max':>8s} "
        f"{'slope/min':>10s} {'after failovers':>16s}  flat"
    )
    print(header)
    print("-" * len(header))
    for name, of in METRICS.items():
        values = [of(s) for s in late]
        slope = slope_per_minute([(s["t"], of(s)) for s in late])
        ceiling = max(of(s) for s in early)
        if name.startswith("RSS"):
            back = "-"
            flat = slope < FLAT_RSS_MB_PER_MIN
            if slope > args.leak_rss:
                leaks.append(f"RSS grows {slope:.2f} MB/min after the warm-up (limit {args.leak_rss:g})")
        else:
            over = [of(s) for s in checkpoints if of(s) > ceiling]
            back = f"{len(checkpoints) - len(over)}/{len(checkpoints)} back"
            flat = slope < FLAT_COUNT_PER_MIN and not over
            end = statistics.median(of(s) for s in late[-3:])
            limit = {"fds": args.leak_fds, "threads (OS)": args.leak_threads}.get(name)
            if limit is not None and end - ceiling > limit:
                leaks.append(f"{name}: {end:.0f} at the end, {end - ceiling:.0f} above the warm-up's {ceiling:.0f}")
        if not flat:
            not_flat.append(name)
        digits = 1 if name.startswith("RSS") else 0
        print(
            f"{name:18s} {len(values):7d} {ceiling:11.{digits}f} {values[0]:8.{digits}f} {values[-1]:8.{digits}f} "
            f"{max(values):8.{digits}f} {slope:+10.3f} {back:>16s}  {'yes' if flat else 'NO'}"
        )
    print(
        f"flat: RSS slope < {FLAT_RSS_MB_PER_MIN:g} MB/min; fds and threads slope < {FLAT_COUNT_PER_MIN:g}/min and "
        "the sample before each later failover and the last one at most the warm-up's max"
    )
    marks = [("start", run.samples[0]), ("end of warm-up", early[-1]), ("last", late[-1])]
    marks += list(run.closing.items())
    print("\nfds by kind, threads:")
    for label, one in marks:
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(one["fd_kinds"].items()))
        print(
            f"  {label:15s} t={one['t']:6.0f}s fds {one['fds']:3d} ({kinds}); "
            f"threads {one['threads_os']} os / {one['threads_py']} py; rss {one['rss_kb'] / 1024:.1f} MB"
        )
        print(f"  {'':15s} threads: {', '.join(one['thread_names'])}")
        if "os_thread_names" in one:
            named = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in one["os_thread_names"].items())
            print(f"  {'':15s} OS threads: {named}")
    changed = _os_thread_changes(run.samples)
    if changed:
        print("\nOS threads by name, where the count changed:")
        for t, names in changed:
            print(f"  t={t:6.0f}s {names}")
    return not_flat, leaks


def _os_thread_changes(samples: list[dict[str, Any]]) -> list[tuple[float, dict[str, int]]]:
    """The samples whose OS threads by name differ from the sample before (the first one too)."""
    changes, before = [], None
    for one in samples:
        names = one.get("os_thread_names")
        if names is not None and names != before:
            changes.append((one["t"], names))
            before = names
    return changes


def print_counts(run: Run) -> None:
    if run.done is None:
        print("the worker printed no final counts")
        return
    ops, errors = run.done["done"]["ops"], run.done["done"]["errors"]
    print("\noperations (done without error):")
    for name, count in sorted(ops.items()):
        print(f"  {name:36s} {count:10,d}")
    print("errors (counted, not fatal):" if errors else "errors: none")
    for name, count in sorted(errors.items()):
        print(f"  {name:60s} {count:6,d}")
    for key, text in run.done.get("unexpected", {}).items():
        print(f"\nfirst unexpected {key}:\n{text}")


def failover(cluster: DevServer, kind: str, began: float, clock: float) -> Failover:
    leader = cluster.partition_leaders(STREAM, timeout=10).get(0)
    if leader is None:
        return Failover(kind, "-", began, time.monotonic() - clock, "the partition had no leader")
    done = Failover(kind, leader, began)
    if kind == "kill":
        cluster.kill(leader)
        time.sleep(OUTAGE)
        cluster.restart(leader, timeout=120)
    else:
        cluster.freeze(leader)
        try:
            time.sleep(OUTAGE)
        finally:
            cluster.thaw(leader)
    done.ended = time.monotonic() - clock
    return done


def create_stream(cluster: DevServer) -> None:
    with LiftbridgeClient(cluster.brokers, request_timeout=30) as client:
        client.create_stream(STREAM, STREAM, replication_factor=3, min_isr=2)
        deadline = time.monotonic() + 30
        while len(client.fetch_partition_metadata(STREAM, 0).isr) < 3:
            if time.monotonic() > deadline:
                raise DevServerError("the soak stream's ISR did not reach 3 nodes in 30 s")
            time.sleep(0.2)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def stop_worker(worker: subprocess.Popen[str]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warm-up", type=float, default=2.0, help="minutes left out of the slopes (default 2)")
    parser.add_argument("--failover-every", type=float, default=60.0, help="seconds (default 60; 0: none)")
    parser.add_argument("--sample-every", type=float, default=10.0)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between two rounds of the worker")
    parser.add_argument("--no-nats", action="store_true", help="no publish_batch over NATS")
    parser.add_argument("--leak-fds", type=int, default=16)
    parser.add_argument("--leak-threads", type=int, default=16)
    parser.add_argument("--leak-rss", type=float, default=5.0, help="MB per minute")
    args = parser.parse_args()
    if args.warm_up * 60 >= args.minutes * 60 - 2 * args.sample_every:
        parser.error("--warm-up must leave at least a few samples of --minutes")
    return args


def start_worker(cluster: DevServer, args: argparse.Namespace, log: Path) -> subprocess.Popen[str]:
    """The client process, tied to this one (it dies with it)."""
    argv = [sys.executable, str(WORKER), "--brokers", ",".join(cluster.brokers), "--stream", STREAM]
    argv += ["--seconds", str(args.minutes * 60), "--sample-every", str(args.sample_every), "--pause", str(args.pause)]
    if not args.no_nats:
        argv += ["--nats", cluster.nats_servers[0]]
    setpriv = shutil.which("setpriv")
    prefix = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
    with log.open("w") as stderr:
        return subprocess.Popen([*prefix, *argv], stdout=subprocess.PIPE, stderr=stderr, text=True)


def soak(
    cluster: DevServer, worker: subprocess.Popen[str], args: argparse.Namespace, failovers: list[Failover]
) -> None:
    """Failovers on schedule, each added to ``failovers``, until the worker's time is up or it ended."""
    clock, seconds = time.monotonic(), args.minutes * 60
    next_failover = FIRST_FAILOVER if args.failover_every > 0 else float("inf")
    while worker.poll() is None and time.monotonic() - clock < seconds:
        now = time.monotonic() - clock
        if next_failover <= now < seconds - QUIET_END:
            kind = ["kill", "freeze"][len(failovers) % 2]
            try:
                done = failover(cluster, kind, now, clock)
            except BaseException as exc:
                failovers.append(Failover(kind, "?", now, problem=f"raised {type(exc).__name__}"))
                raise
            failovers.append(done)
            print(f"  failover {len(failovers)}: {kind} {done.node} at {now:.0f}s, over at {done.ended:.0f}s")
            next_failover += args.failover_every
        time.sleep(0.2)


def main() -> int:
    args = parse_args()
    print(machine_line())
    print(f"uptime at start: {uptime()}")
    run, failovers = Run(), list[Failover]()
    log = Path(tempfile.mkdtemp(prefix="bench-soak-")) / "worker.log"
    worker: subprocess.Popen[str] | None = None
    measured = True
    cluster = start_cluster(size=3)
    try:
        create_stream(cluster)
        print(f"cluster: {', '.join(cluster.brokers)} (NATS {cluster.nats_servers[0]}); stream {STREAM!r}")
        worker = start_worker(cluster, args, log)
        reader = threading.Thread(target=read_worker, args=(worker.stdout, run), daemon=True)
        reader.start()
        print(f"worker pid {worker.pid}, {args.minutes:g} minutes; its log: {log}", flush=True)
        soak(cluster, worker, args, failovers)
        try:
            worker.wait(timeout=180)
        except subprocess.TimeoutExpired:
            print("the worker did not finish within 180 s of the end: killed (a hang)")
            measured = False
        reader.join(timeout=30)
    except DevServerError as exc:
        print(f"the cluster failed: {exc}")
        measured = False
    finally:
        if worker is not None:
            stop_worker(worker)
        cluster.stop()
    status = worker.returncode if worker is not None else None
    return report(run, failovers, args, measured=measured, status=status, log=log)


def report(
    run: Run, failovers: list[Failover], args: argparse.Namespace, *, measured: bool, status: int | None, log: Path
) -> int:
    print(f"uptime at end: {uptime()}")
    print(f"\nfailovers: {len(failovers)}")
    for number, one in enumerate(failovers, 1):
        print(f"  {number}. {one.kind:6s} {one.node} at {one.began:5.0f}s, over at {one.ended:5.0f}s {one.problem}")
    print_counts(run)
    not_flat, leaks = analyse(run, failovers, args)
    wrong = run.wrong + (run.done["wrong"] if run.done else [])
    for text in run.noise[-10:]:
        print(f"worker: {text}")
    for text in wrong:
        print(f"WRONG DATA: {text}")
    for text in leaks:
        print(f"LEAK: {text}")
    print(f"\nnot flat: {', '.join(not_flat)}" if not_flat else "\nflat: RSS, fds and threads")
    if wrong or leaks:
        return 1
    if not measured or status != 0 or run.done is None:
        print(f"the worker ended with status {status}; its log: {log}")
        return 2
    shutil.rmtree(log.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
