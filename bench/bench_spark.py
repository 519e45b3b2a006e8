"""Throughput and per-task memory of the ``liftbridge`` Spark source against a real single-node server.

    .venv/bin/python bench/bench_spark.py [--messages 1000000] [--partitions 4] [--size 256]
                                          [--memory-messages 100000,1000000] [--memory-runs 3] [--runs 2] [--no-go]
                                          [--standalone WORKERS]

Starts one Liftbridge node on 127.0.0.1 (``liftbridge_provider.devserver``), publishes
``--messages`` values of ``--size`` random bytes (keys ``k<i>``) round-robin over
``--partitions`` partitions with ``publish_batch`` (ack policy LEADER, window 1024, chunks
of 100,000), then measures in this one process, side by side:

- go-liftbridge ``Subscribe`` (``golbbench subscribe``, tools/golbbench, built by ``make golbbench``)
  over the same offsets, one partition after another in a subprocess each, the Go-measured seconds
  summed (process start and connect not counted): the anchor of the "vs go" column; skipped with
  a notice when the binary is missing;
- the same with a process per partition, all at once (the slowest one's own seconds): what this
  machine can read, the anchor of the "Spark -> Parquet / go side by side" ratio;
- ``read_range`` in one thread, partition after partition: the baseline ("vs read_range");
- ``read_slice`` in one thread over the same ranges (the source's task code without Spark:
  read_range plus building Arrow batches);
- ``spark.read.format("liftbridge")`` (startingOffsets earliest, endingOffsets latest) written
  to the ``noop`` sink, with the default planning (one input partition per stream partition)
  and with ``maxRecordsPerPartition`` = messages / 8;
- the same written to Parquet (snappy) in a temporary folder; the Parquet rows are counted
  afterwards (not timed) and must equal ``--messages``;
- the ingest job's ``run`` over the same offsets into a new Parquet lake (claims, one Spark job,
  footers, commits, manifest): the "ingest job / plain Spark -> Parquet" ratio.

With ``--standalone N`` (default 2) it then starts a Spark standalone master and N one-core workers
on loopback with ``spark-class`` (``_standalone.py``) and, in a client-mode application of its own
(``_standalone_run.py``, Spark's event log on), runs the plain read-and-write and the ingest job
``--runs`` times each: their seconds, the ratio, and each run's task timeline per executor (whether
the workers read at the same time).

Spark runs ``local[2]`` with the UI off. Every test runs ``--runs`` times (default 2,
interleaved) and the table shows the fastest run (the first Spark run pays for JVM and Python
worker warm-up). MB/s counts payload bytes (1 MB = 10^6 bytes); "machine %" is the busy share
of all CPUs (from /proc/stat) during the shown run.

Then, for peak memory per task, it publishes ``max(--memory-messages)`` messages to a separate
single-partition stream and, in a fresh process per size and run (``_spark_memory_worker.py``),
runs ``read_slice`` over offsets ``[0, size)``, discarding the batches, and reports ``ru_maxrss``
after the imports (baseline) and after the read (peak); ``--memory-runs`` (default 3) runs per
size, interleaved, the highest peak shown.

About 5.5 minutes with the defaults on 2 CPUs (a third of it publishing 2,000,000 messages).
This is a benchmark, not a test: it prints numbers and asserts nothing about time.
It reports (and exits 1 on) wrong results: failed publishes, missing rows. After
``--time-limit`` seconds (default 1200) a hung run prints its Python stacks and exits.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from _cpu_split import PARTS, WATCHED, Meter, cpu_row, find_java
from _golbbench import find_golbbench, go_liftbridge_version, run_golbbench, run_golbbench_together
from _machine import machine_line
from _standalone import standalone_cluster
from pyspark.sql import SparkSession

from liftbridge_provider.client import LiftbridgeClient, LiftbridgeError, PublishMessage
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.core.spark_planning import Slice
from liftbridge_provider.devserver import start_single
from liftbridge_provider.devserver.binaries import liftbridge_binary, liftbridge_version
from liftbridge_provider.spark import ingest
from liftbridge_provider.spark.options import parse_options
from liftbridge_provider.spark.reader import arrow_schema, read_slice

WORKER = Path(__file__).with_name("_spark_memory_worker.py")
STANDALONE_RUN = Path(__file__).with_name("_standalone_run.py")
GO_ANCHOR = "go Subscribe (1 partition at a time)"
GO_SIDE_BY_SIDE = "go Subscribe (a process per partition, side by side)"
PLAIN_PARQUET = "Spark -> Parquet, default planning"
INGEST_JOB = "ingest job -> Parquet lake (claims, one job, footers, commits)"
BASELINE = "read_range (1 thread, baseline)"
CHUNK = 100_000  # messages per publish_batch call: bounds the memory of the publisher


# -- measuring ------------------------------------------------------------------------


@dataclass
class Test:
    """All runs of one throughput test."""

    name: str
    input_partitions: int | str
    rows: int = 0
    runs: list[Meter] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def best(self) -> Meter:
        return min(self.runs, key=lambda m: m.seconds)


# -- publishing -------------------------------------------------------------------------


def create_stream(client: LiftbridgeClient, name: str, partitions: int) -> None:
    client.create_stream(name, name, partitions=partitions)
    deadline = time.monotonic() + 10
    for partition in range(partitions):  # partition leaders may need a moment after CreateStream returns
        while True:
            try:
                client.fetch_partition_metadata(name, partition)
                break
            except LiftbridgeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def publish(client: LiftbridgeClient, stream: str, messages: int, partitions: int, size: int) -> float:
    """Publish ``messages`` random values round-robin over the partitions; returns the seconds taken."""
    started = time.perf_counter()
    for first in range(0, messages, CHUNK):
        count = min(CHUNK, messages - first)
        payload = os.urandom(count * size)
        batch = [
            PublishMessage(
                payload[j * size : (j + 1) * size], key=f"k{first + j}".encode(), partition=(first + j) % partitions
            )
            for j in range(count)
        ]
        client.publish_batch(stream, batch, ack_policy="leader", window=1024)
    return time.perf_counter() - started


def high_watermarks(client: LiftbridgeClient, stream: str, partitions: int) -> list[int]:
    return [client.fetch_partition_metadata(stream, p).high_watermark for p in range(partitions)]


# -- the tests ----------------------------------------------------------------------------


class Bench:
    def __init__(
        self, client: LiftbridgeClient, brokers: str, stream: str, golbbench: Path | None, args: argparse.Namespace
    ) -> None:
        self.client = client
        self.brokers = brokers
        self.stream = stream
        self.golbbench = golbbench
        self.args = args
        self.ends = [hw + 1 for hw in high_watermarks(client, stream, args.partitions)]

    def go_subscribe(self, test: Test) -> None:
        """golbbench subscribe per partition, one after another; the seconds are the sum of Go's own timings."""
        assert self.golbbench is not None
        rows = 0
        seconds = 0.0
        meter = Meter()
        with meter.measure():
            for partition, end in enumerate(self.ends):
                if end == 0:
                    continue
                options = {"brokers": self.brokers, "stream": self.stream, "partition": partition, "count": end}
                outcome = run_golbbench(self.golbbench, "subscribe", options)
                if outcome.problem is not None:
                    test.problems.append(f"run {len(test.runs) + 1}, partition {partition}: {outcome.problem}")
                if outcome.data is not None:
                    rows += outcome.data["messages"]
                    seconds += outcome.data["seconds"]
        if seconds > 0:  # else (every partition failed, a problem is listed) the loop's wall-clock time stays
            meter.seconds = seconds  # machine % stays that of the whole loop, subprocess start-ups included
        test.rows = rows
        test.runs.append(meter)

    def go_side_by_side(self, test: Test) -> None:
        """golbbench subscribe for every partition at once, a process each: what the machine can read; the
        seconds are the slowest process's own timing (process start and connect not counted)."""
        assert self.golbbench is not None
        meter = Meter()
        with meter.measure():
            outcomes = run_golbbench_together(
                self.golbbench,
                "subscribe",
                [
                    {"brokers": self.brokers, "stream": self.stream, "partition": partition, "count": end}
                    for partition, end in enumerate(self.ends)
                    if end
                ],
            )
        rows, slowest = 0, 0.0
        for outcome in outcomes:
            if outcome.problem is not None:
                test.problems.append(f"run {len(test.runs) + 1}: {outcome.problem}")
            if outcome.data is not None:
                rows += outcome.data["messages"]
                slowest = max(slowest, outcome.data["seconds"])
        if slowest > 0:
            meter.seconds = slowest
        test.rows = rows
        test.runs.append(meter)

    def read_range(self, test: Test) -> None:
        rows = 0
        meter = Meter()
        with meter.measure():
            for partition, end in enumerate(self.ends):
                for _message in self.client.read_range(self.stream, partition, 0, end):
                    rows += 1
        test.rows = rows
        test.runs.append(meter)

    def read_slice(self, test: Test) -> None:
        options = parse_options({"brokers": self.brokers, "ranges": "{}"})
        schema = arrow_schema()
        rows = 0
        meter = Meter()
        with meter.measure():
            for partition, end in enumerate(self.ends):
                for batch in read_slice(options, self.stream, Slice(partition, 0, end), schema):
                    rows += batch.num_rows
        test.rows = rows
        test.runs.append(meter)


class SparkBench:
    """One SparkSession, started before any gRPC channel exists in this process: pyspark forks (with a
    preexec_fn) to launch the JVM, and a fork while gRPC threads run can break the child
    ("Java gateway process exited before sending its port number")."""

    def __init__(self, messages: int, workdir: Path) -> None:
        # pyspark's launcher scripts (spark-submit, find-spark-home) live in the venv's bin folder.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        started = time.perf_counter()
        self.spark = (
            SparkSession.builder.master("local[2]")
            .appName("bench-spark")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        self.spark.sparkContext.setLogLevel("ERROR")
        WATCHED.jvm = find_java(self.spark.sparkContext._gateway.proc.pid)  # type: ignore[union-attr]
        self.startup = time.perf_counter() - started
        self.brokers = ""
        self.stream = ""
        self.messages = messages
        self.workdir = workdir
        self.outputs = 0
        self.parquet_note = "?"

    def frame_options(self, extra: dict[str, str]) -> dict[str, str]:
        return {
            "brokers": self.brokers,
            "stream": self.stream,
            "startingOffsets": "earliest",
            "endingOffsets": "latest",
            **extra,
        }

    def input_partitions(self, extra: dict[str, str]) -> int:
        frame = self.spark.read.format("liftbridge").options(**self.frame_options(extra)).load()
        return int(frame.rdd.getNumPartitions())

    def noop(self, test: Test, extra: dict[str, str]) -> None:
        meter = Meter()
        with meter.measure():
            frame = self.spark.read.format("liftbridge").options(**self.frame_options(extra)).load()
            frame.write.format("noop").mode("overwrite").save()
        test.rows = self.messages  # the noop sink counts nothing; the Parquet runs check the row count
        test.runs.append(meter)

    def parquet(self, test: Test, extra: dict[str, str]) -> None:
        self.outputs += 1
        path = str(self.workdir / f"out-{self.outputs}")
        meter = Meter()
        with meter.measure():
            frame = self.spark.read.format("liftbridge").options(**self.frame_options(extra)).load()
            frame.write.option("compression", "snappy").mode("overwrite").parquet(path)
        rows = int(self.spark.read.parquet(path).count())
        files = list(Path(path).glob("*.parquet"))
        size = sum(f.stat().st_size for f in files)
        shutil.rmtree(path)  # 1M rows are about 275 MB
        test.rows = rows
        if rows != self.messages:
            test.problems.append(f"run {len(test.runs) + 1}: Parquet holds {rows} rows, expected {self.messages}")
        test.runs.append(meter)
        self.parquet_note = f"{len(files)} Parquet file(s), {size / 1e6:.0f} MB (snappy)"

    def ingest(self, test: Test, partitions: int) -> None:
        """The ingest job's ``run`` (Parquet, a new lake each run) over every partition's offsets."""
        self.outputs += 1
        lake = self.workdir / f"lake-{self.outputs}"
        with LiftbridgeClient(self.brokers.split(",")) as client:
            ends = [hw + 1 for hw in high_watermarks(client, self.stream, partitions)]
        document = RangesDocument(self.stream, tuple(OffsetRange(p, 0, end) for p, end in enumerate(ends)))
        argv = ["--brokers", self.brokers, "--ranges", document.dumps(), "--output", str(lake)]
        meter = Meter()
        with meter.measure():
            outcome = ingest.run(self.spark, ingest.parse_args(argv))
        test.rows = sum(entry["rows"] for entry in outcome.entries)
        if outcome.problems or test.rows != self.messages:
            test.problems.append(f"run {len(test.runs) + 1}: {test.rows} rows, problems {outcome.problems}")
        shutil.rmtree(lake)
        test.runs.append(meter)

    def stop(self) -> None:
        self.spark.stop()


# -- memory ---------------------------------------------------------------------------------


def memory_run(brokers: str, stream: str, size: int) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, str(WORKER), "--brokers", brokers, "--stream", stream, "--end", str(size)],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"memory worker failed ({result.returncode}): {result.stderr[-2000:]}")
    values: dict[str, float] = json.loads(lines[-1])
    return values


# -- output -------------------------------------------------------------------------------------


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
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False).stderr
        java = java.splitlines()[0] if java else "?"
    except OSError:
        java = "not found"
    return (
        f"Liftbridge {server}, single node on 127.0.0.1 | "
        f"Python {platform.python_version()}, pyspark {version('pyspark')}, pyarrow {version('pyarrow')}, "
        f"grpcio {version('grpcio')} | {java} | go-liftbridge {go_liftbridge_version()} (golbbench)"
    )


def print_table(tests: list[Test], baseline: Test, go: Test | None, size: int, runs: int) -> None:
    base_rate = baseline.rows / baseline.best.seconds
    go_rate = go.rows / go.best.seconds if go is not None and go.rows and go.best.seconds > 0 else None
    header = [
        "test",
        "input partitions",
        "rows",
        "seconds",
        "rows/s",
        "MB/s",
        "vs read_range",
        "vs go",
        "machine %",
        "all runs s",
    ]
    rows = []
    for test in tests:
        best = test.best
        rate = test.rows / best.seconds
        rows.append(
            [
                test.name,
                str(test.input_partitions),
                f"{test.rows:,}",
                f"{best.seconds:.2f}",
                f"{rate:,.0f}",
                f"{test.rows * size / best.seconds / 1e6:.1f}",
                f"{rate / base_rate:.2f}x",
                "ref" if test is go else f"{rate / go_rate:.2f}x" if go_rate else "",
                f"{best.machine * 100:.0f}%",
                " / ".join(f"{m.seconds:.2f}" for m in test.runs),
            ]
        )
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    print(f"Throughput, best of {runs} run(s) per test (the first Spark run includes JVM / Python worker warm-up):")
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True))))
    for row in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))))


def print_cpu(tests: list[Test]) -> None:
    """CPU us per row of each test's shown run, by process: where a saturated machine's time went."""
    header = ["test", "machine", *PARTS, "rest"]
    rows = [[test.name, *cpu_row(test.best, test.rows)] for test in tests]
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    print(
        "CPU us per row of the shown run (machine: all CPUs busy; rest: this process and go's readers; "
        "go's rows include process start and connect):"
    )
    for row in [header, *rows]:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))))


def print_ratios(by_name: dict[str, Test]) -> None:
    """The issue's two Spark ratios, each from the best runs of this one run."""

    def rate(name: str) -> float | None:
        test = by_name.get(name)
        return test.rows / test.best.seconds if test is not None and test.rows and test.best.seconds > 0 else None

    plain, job, go = rate(PLAIN_PARQUET), rate(INGEST_JOB), rate(GO_SIDE_BY_SIDE)
    if plain and job:
        print(f"ingest job / plain Spark -> Parquet (same ranges, local[2]): {job / plain:.2f}x")
    if plain and go:
        print(f"Spark -> Parquet / go Subscribe side by side (same partitions): {plain / go:.2f}x")


def run_standalone(brokers: str, stream: str, args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """The standalone phase (``_standalone_run.py``) on a cluster started here; its JSON result."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-standalone-") as tmp,
        standalone_cluster(Path(tmp), args.standalone) as cluster,
    ):
        progress(f"standalone cluster {cluster.master} with {cluster.workers} one-core workers")
        command = [
            sys.executable, str(STANDALONE_RUN), "--master", cluster.master, "--brokers", brokers,
            "--stream", stream, "--partitions", str(args.partitions), "--runs", str(args.runs),
            "--workdir", str(Path(tmp) / "app"),
        ]  # fmt: skip
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": str(Path(__file__).parent)}
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=args.time_limit)
        sys.stderr.write(done.stderr[-2000:] if done.returncode else "")
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"the standalone phase failed ({done.returncode}): {done.stderr[-3000:]}")
        result: dict[str, list[dict[str, Any]]] = json.loads(lines[-1])
        return result


def print_standalone(result: dict[str, list[dict[str, Any]]], workers: int) -> None:
    best = {kind: min(runs, key=lambda r: r["seconds"]) for kind, runs in result.items()}
    plain, job = best["plain"], best["ingest"]
    print()
    print(f"Standalone cluster, {workers} one-core workers on loopback (client mode), best of {len(result['plain'])}:")
    for name, run in (("plain Spark -> Parquet", plain), ("ingest job -> Parquet lake", job)):
        print(
            f"  {name:<28} {run['seconds']:7.2f} s, {run['rows']:,} rows, executors {', '.join(run['executors'])}, "
            f"tasks of 2+ executors at once for {run['together_seconds']:.1f} s"
        )
        for line in run["timeline"]:
            print(f"    {line}")
    print(f"ingest job / plain Spark -> Parquet (standalone): {plain['seconds'] / job['seconds']:.2f}x")


def print_memory(results: dict[int, list[dict[str, float]]]) -> None:
    sizes = sorted(results)
    runs = max(len(r) for r in results.values())
    print(
        f"Peak memory of one task (read_slice in a fresh process per run, batches discarded; {runs} run(s) per size, "
        "columns show the run with the highest peak):"
    )
    worst = {s: max(results[s], key=lambda r: r["peak_maxrss_mib"]) for s in sizes}
    label_width, width = 36, 20
    print("".ljust(label_width) + "".join(f"{s:>{width},}" for s in sizes))
    lines: list[tuple[str, Callable[[dict[str, float]], str]]] = [
        ("rows read", lambda r: f"{int(r['rows']):,}"),
        ("record batches (largest rows)", lambda r: f"{int(r['batches'])} ({int(r['largest_batch']):,})"),
        ("seconds", lambda r: f"{r['seconds']:.2f}"),
        ("rows/s", lambda r: f"{r['rows'] / r['seconds']:,.0f}"),
        ("baseline ru_maxrss MiB (imports)", lambda r: f"{r['baseline_maxrss_mib']:.1f}"),
        ("peak ru_maxrss MiB (after read)", lambda r: f"{r['peak_maxrss_mib']:.1f}"),
        ("peak - baseline MiB", lambda r: f"{r['peak_maxrss_mib'] - r['baseline_maxrss_mib']:.1f}"),
        ("RSS MiB before / after read", lambda r: f"{r['baseline_rss_mib']:.0f} / {r['end_rss_mib']:.0f}"),
    ]
    for label, cell in lines:
        print(label.ljust(label_width) + "".join(f"{cell(worst[s]):>{width}}" for s in sizes))
    every = {s: " / ".join(f"{r['peak_maxrss_mib']:.0f}" for r in results[s]) for s in sizes}
    print("peak ru_maxrss MiB, every run".ljust(label_width) + "".join(f"{every[s]:>{width}}" for s in sizes))


# -- main -------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages of the throughput stream (1000000)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the throughput stream (4)")
    parser.add_argument("--size", type=int, default=256, help="value size in bytes (256)")
    parser.add_argument(
        "--memory-messages", default="100000,1000000", help="range sizes of the memory test (100000,1000000)"
    )
    parser.add_argument("--memory-runs", type=int, default=3, help="fresh worker runs per memory-test size (3)")
    parser.add_argument("--runs", type=int, default=2, help="runs of every throughput test; the best is shown (2)")
    parser.add_argument("--no-go", action="store_true", help="skip the go-liftbridge (golbbench) anchor")
    parser.add_argument(
        "--standalone",
        type=int,
        default=2,
        metavar="WORKERS",
        help="also run plain Spark -> Parquet and the ingest job on a standalone cluster of this many one-core "
        "workers started on loopback, with each run's task timeline (default 2; 0 skips it)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=1200,
        help="seconds after which a hung run dumps its stacks and exits (1200)",
    )
    args = parser.parse_args(argv)
    args.memory_sizes = sorted({int(s) for s in args.memory_messages.split(",") if s.strip()})
    if args.messages < 8 or min(args.partitions, args.size, args.runs, args.memory_runs) < 1:
        parser.error("--messages must be >= 8, --partitions, --size, --runs and --memory-runs >= 1")
    if any(s < 1 for s in args.memory_sizes):
        parser.error("--memory-messages must be >= 1")
    return args


def progress(text: str) -> None:
    print(f"  .. {text}", file=sys.stderr, flush=True)


def run_throughput(
    client: LiftbridgeClient,
    spark: SparkBench,
    brokers: str,
    stream: str,
    args: argparse.Namespace,
    *,
    golbbench: Path | None,
) -> tuple[list[Test], str]:
    """Every throughput test, ``args.runs`` times interleaved; returns the tests and a note on Spark."""
    bench = Bench(client, brokers, stream, golbbench, args)
    spark.brokers, spark.stream = brokers, stream
    max_records = max(1, args.messages // 8)
    default_planning: dict[str, str] = {}
    split_planning = {"maxRecordsPerPartition": str(max_records)}
    default_count = spark.input_partitions(default_planning)
    split_count = spark.input_partitions(split_planning)
    split = f"maxRecordsPerPartition={max_records}"
    steps: list[tuple[Test, Callable[[Test], None]]] = [
        (Test(BASELINE, args.partitions), bench.read_range),
        (Test("read_slice (1 thread, no Spark)", args.partitions), bench.read_slice),
        (Test("Spark -> noop, default planning", default_count), lambda t: spark.noop(t, default_planning)),
        (Test(f"Spark -> noop, {split}", split_count), lambda t: spark.noop(t, split_planning)),
        (Test(PLAIN_PARQUET, default_count), lambda t: spark.parquet(t, default_planning)),
        (Test(f"Spark -> Parquet, {split}", split_count), lambda t: spark.parquet(t, split_planning)),
        (Test(INGEST_JOB, "cores"), lambda t: spark.ingest(t, args.partitions)),
    ]
    if golbbench is not None:
        steps.insert(0, (Test(GO_SIDE_BY_SIDE, args.partitions), bench.go_side_by_side))
        steps.insert(0, (Test(GO_ANCHOR, args.partitions), bench.go_subscribe))
    for run in range(args.runs):
        for test, step in steps:
            step(test)
            progress(f"run {run + 1}: {test.name:<48} {test.runs[-1].seconds:7.2f} s")
    note = (
        f"Spark local[2], UI off; session start {spark.startup:.1f} s (not counted); "
        f"Parquet output: {spark.parquet_note}"
    )
    return [test for test, _ in steps], note


@dataclass
class Results:
    tests: list[Test] = field(default_factory=list)
    spark_note: str = ""
    memory: dict[int, list[dict[str, float]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    standalone: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def run_on_server(spark: SparkBench, golbbench: Path | None, args: argparse.Namespace) -> Results:
    """Start the server, publish, run the throughput tests, then the memory test."""
    results = Results()
    with start_single() as server, LiftbridgeClient(server.brokers) as client:
        brokers = ",".join(server.brokers)
        WATCHED.server = server.nodes[0].process.pid
        stream = "bench-spark"
        create_stream(client, stream, args.partitions)
        seconds = publish(client, stream, args.messages, args.partitions, args.size)
        print(
            f"publish_batch: {args.messages:,} messages over {args.partitions} partitions in {seconds:.1f} s = "
            f"{args.messages / seconds:,.0f} msgs/s, {args.messages * args.size / seconds / 1e6:.1f} MB/s",
            flush=True,
        )
        stored = sum(hw + 1 for hw in high_watermarks(client, stream, args.partitions))
        if stored != args.messages:
            results.problems.append(f"the stream holds {stored} messages, expected {args.messages}")

        results.tests, results.spark_note = run_throughput(client, spark, brokers, stream, args, golbbench=golbbench)
        if args.standalone:
            results.standalone = run_standalone(brokers, stream, args)
            for kind, runs in results.standalone.items():
                results.problems += [
                    f"standalone {kind}: {r['rows']} rows, expected {args.messages}"
                    for r in runs
                    if r["rows"] != args.messages
                ]
        for test in results.tests:
            if test.rows != args.messages:
                results.problems.append(f"{test.name}: {test.rows} rows, expected {args.messages}")
            results.problems.extend(f"{test.name}: {p}" for p in test.problems)

        memory_stream = "bench-spark-memory"
        largest = args.memory_sizes[-1]
        create_stream(client, memory_stream, 1)
        seconds = publish(client, memory_stream, largest, 1, args.size)
        print(
            f"publish_batch: {largest:,} messages to one partition (memory test) in {seconds:.1f} s = "
            f"{largest / seconds:,.0f} msgs/s",
            flush=True,
        )
        for run in range(args.memory_runs):
            for size in args.memory_sizes:
                result = memory_run(brokers, memory_stream, size)
                results.memory.setdefault(size, []).append(result)
                if result["rows"] != size:
                    results.problems.append(f"memory test: read {result['rows']} rows, expected {size}")
                progress(f"run {run + 1}: memory test {size:,}: peak {result['peak_maxrss_mib']:.0f} MiB")
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    faulthandler.dump_traceback_later(args.time_limit, exit=True)  # a benchmark must not hang forever
    golbbench = None if args.no_go else find_golbbench()
    print(versions())
    print(machine_line())
    print(
        f"{args.messages:,} messages of {args.size} random bytes over {args.partitions} partitions; "
        f"memory test: {', '.join(f'{s:,}' for s in args.memory_sizes)} messages of one partition",
        flush=True,
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        spark = SparkBench(args.messages, Path(tmp))  # first: before this process opens any gRPC channel
        progress(f"Spark session started in {spark.startup:.1f} s")
        try:
            results = run_on_server(spark, golbbench, args)
        finally:
            spark.stop()

    print(results.spark_note)
    print()
    by_name = {test.name: test for test in results.tests}
    print_table(results.tests, by_name[BASELINE], by_name.get(GO_ANCHOR), args.size, args.runs)
    print()
    print_cpu(results.tests)
    print_ratios(by_name)
    if results.standalone:
        print_standalone(results.standalone, args.standalone)
    print()
    print_memory(results.memory)
    print()
    for problem in results.problems:
        print(f"PROBLEM {problem}")
    print(f"1-minute load average at end: {os.getloadavg()[0]:.2f}")
    print(f"total wall time {time.perf_counter() - started:.0f} s (including server and Spark start-up)")
    faulthandler.cancel_dump_traceback_later()
    return 1 if results.problems else 0


if __name__ == "__main__":
    sys.exit(main())
