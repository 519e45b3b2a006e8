"""The Parquet ingest's cost against the stream's partition count: the same rows from few and from many partitions.

    .venv/bin/python bench/bench_lake_partitions.py [--messages 200000] [--partitions 4,256] [--size 100]
                                                    [--runs 3]

Starts one Liftbridge node on 127.0.0.1, publishes ``--messages`` values of ``--size`` random bytes
round-robin over each stream (one stream per entry of ``--partitions``), then, in one ``local[2]``
SparkSession, runs the ingest job's ``run`` (Parquet, a new lake on the local disk each run) over
every partition's offsets ``--runs`` times per stream, interleaved, and then once more over the same
ranges into the same lake (a run that finds nothing new). It prints each stream's best run, the ratio
of the largest partition count to the smallest (the aim: at most 1.3x), the CPU model, the load and
the command. Numbers only, no assertions.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine_line

from liftbridge_provider.client import LiftbridgeClient, PublishMessage
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.devserver import start_single
from liftbridge_provider.spark import ingest

CHUNK = 50_000


def spark_session() -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-lake-partitions")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def publish(client: LiftbridgeClient, stream: str, messages: int, partitions: int, size: int) -> list[int]:
    """``messages`` random values round-robin over the partitions; each partition's end offset."""
    client.create_stream(stream, stream, partitions=partitions)
    for partition in range(partitions):  # leaders may need a moment after CreateStream returns
        deadline = time.monotonic() + 10
        while True:
            try:
                client.fetch_partition_metadata(stream, partition)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    for first in range(0, messages, CHUNK):
        count = min(CHUNK, messages - first)
        payload = os.urandom(count * size)
        batch = [
            PublishMessage(payload[j * size : (j + 1) * size], partition=(first + j) % partitions) for j in range(count)
        ]
        client.publish_batch(stream, batch, ack_policy="leader", window=1024)
    return [client.fetch_partition_metadata(stream, p).high_watermark + 1 for p in range(partitions)]


def ingest_once(spark: SparkSession, brokers: str, document: RangesDocument, lake: Path) -> tuple[float, int]:
    argv = ["--brokers", brokers, "--ranges", document.dumps(), "--output", str(lake)]
    started = time.perf_counter()
    outcome = ingest.run(spark, ingest.parse_args(argv))
    seconds = time.perf_counter() - started
    if outcome.problems:
        raise RuntimeError(f"ingest problems: {outcome.problems}")
    return seconds, sum(e["rows"] for e in outcome.entries)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--partitions", default="4,256", help="partition counts, comma separated (4,256)")
    parser.add_argument("--size", type=int, default=100, help="bytes per value (100)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    counts = [int(p) for p in args.partitions.split(",")]
    print(machine_line())
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]), flush=True)
    spark = spark_session()  # before any gRPC channel: pyspark forks to start the JVM
    best: dict[int, float] = {}
    idle: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-lake-") as tmp, start_single() as server:
        brokers = ",".join(server.brokers)
        documents = {}
        with LiftbridgeClient(server.brokers) as client:
            for count in counts:
                stream = f"bench-lake-{count}"
                ends = publish(client, stream, args.messages, count, args.size)
                documents[count] = RangesDocument(stream, tuple(OffsetRange(p, 0, e) for p, e in enumerate(ends)))
        ingest_once(spark, brokers, documents[counts[0]], Path(tmp) / "warm-up")  # JVM and Python workers warm
        for run in range(args.runs):
            for count in counts:
                lake = Path(tmp) / f"lake-{count}-{run}"
                seconds, rows = ingest_once(spark, brokers, documents[count], lake)
                if rows != documents[count].total:
                    raise RuntimeError(f"{count} partitions: {rows} rows, expected {documents[count].total}")
                print(f"run {run + 1}: {count} partitions: {seconds:.2f} s", flush=True)
                best[count] = min(best.get(count, seconds), seconds)
                if run == args.runs - 1:
                    idle[count], _ = ingest_once(spark, brokers, documents[count], lake)
                shutil.rmtree(lake)
    spark.stop()
    print()
    print(f"{args.messages:,} messages of {args.size} bytes, local[2], best of {args.runs}:")
    for count in counts:
        print(f"  {count:>4} partitions: {best[count]:6.2f} s   (a run that finds nothing new: {idle[count]:.2f} s)")
    low, high = min(counts), max(counts)
    print(f"ratio {high} / {low} partitions: {best[high] / best[low]:.2f}x (aim: at most 1.3x)")
    print(f"nothing new, ratio {high} / {low}: {idle[high] / idle[low]:.2f}x")
    print(f"1-minute load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
