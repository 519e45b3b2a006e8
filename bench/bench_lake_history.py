"""A Parquet lake's bookkeeping per run against the lake's age: after one earlier run and after 100,000.

    .venv/bin/python bench/bench_lake_history.py [--history 100000] [--runs 30] [--pieces 2] [--no-s3]

For each place (the local disk, and the S3 gateway of liftbridge_provider.devserver.s3 through S3A unless
``--no-s3``) it makes two lakes whose partition ledger holds one earlier run and ``--history`` earlier runs
(written through the store, as compactions leave them: tests/spark/lake_history.py), then runs the ledger's
share of ``--runs`` runs on each, interleaved: each lands the next 10 offsets in ``--pieces`` pieces (read,
claim, commit, publish, compact, settle; a small staged object stands for Spark's rows, its write not timed).
It prints the median seconds per run, the ratio aged / young (the aim: at most 1.2x), the ledger's requests
per run by kind (CountingStore) and, on S3, S3A's own request counters per run. Numbers only, no assertions.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from _machine import machine_line  # noqa: E402

from liftbridge_provider.core.object_store import S3Settings  # noqa: E402
from liftbridge_provider.core.ranges import OffsetRange  # noqa: E402
from liftbridge_provider.devserver.s3 import s3a_jars, start_s3  # noqa: E402
from liftbridge_provider.spark.lake_store import CountingStore, HadoopStore  # noqa: E402
from tests.spark.lake_history import bookkeeping_run, write_history  # noqa: E402

OFFSETS = 10  # offsets per measured run


def spark_session(with_s3: bool) -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("bench-lake-history")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if with_s3:
        builder = builder.config("spark.jars", ",".join(str(jar) for jar in s3a_jars()))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def measure(spark: SparkSession, place: str, root: str, args: argparse.Namespace) -> None:
    """Young and aged lakes under ``root``, ``args.runs`` measured runs each, interleaved; prints the results."""
    history, runs, pieces = args.history, args.runs, args.pieces
    lakes: dict[str, tuple[CountingStore, str]] = {}
    for name, count in (("young", 1), ("aged", history)):
        plain = HadoopStore(spark, f"{root}/{name}")
        folder = f"{plain.root}/stream=bench"
        write_history(plain, folder, 0, count, history)
        lakes[name] = (CountingStore(plain), folder)
    seconds: dict[str, list[float]] = {"young": [], "aged": []}
    requests: dict[str, list[Counter[str]]] = {"young": [], "aged": []}
    s3a: dict[str, list[int]] = {"young": [], "aged": []}
    for index in range(runs):
        for name, (store, folder) in lakes.items():
            store.counts.clear()
            before = store.s3a_requests()
            start = history + index * OFFSETS
            seconds[name].append(bookkeeping_run(store, folder, OffsetRange(0, start, start + OFFSETS), pieces))
            after = store.s3a_requests()
            requests[name].append(Counter(store.counts))
            s3a[name].append(sum(after.get(k, 0) - before.get(k, 0) for k in after if k != "store_io_request"))
    print(f"{place}: {runs} runs each, {pieces} pieces per run, median (min-max) seconds of the ledger's work:")
    for name in lakes:
        runs_seconds = seconds[name][1:]  # the first run of each lake warms up the JVM paths
        kinds = dict(sorted(requests[name][-1].items()))
        extra = f", S3A requests {statistics.median(s3a[name])}" if place == "s3" else ""
        earlier = 1 if name == "young" else history
        print(
            f"  {name:>5} ({earlier:,} earlier runs): {statistics.median(runs_seconds):.4f} s "
            f"({min(runs_seconds):.4f}-{max(runs_seconds):.4f}); ledger requests {sum(kinds.values())} {kinds}{extra}"
        )
    ratio = statistics.median(seconds["aged"][1:]) / statistics.median(seconds["young"][1:])
    print(f"  ratio aged / young: {ratio:.2f}x (aim: at most 1.2x)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--pieces", type=int, default=2)
    parser.add_argument("--no-s3", action="store_true")
    args = parser.parse_args(argv)
    print(machine_line())
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]), flush=True)
    keys = S3Settings(endpoint=None, access_key=f"bench{secrets.token_hex(8)}", secret_key=secrets.token_hex(20))
    os.environ.update(keys.environment())  # S3A reads them from the environment, before the JVM starts
    spark = spark_session(not args.no_s3)
    with tempfile.TemporaryDirectory(prefix="bench-lake-history-") as tmp:
        measure(spark, "local", tmp, args)
        if not args.no_s3:
            with start_s3(access_key=keys.access_key, secret_key=keys.secret_key) as server:
                conf = spark._jsc.hadoopConfiguration()
                for key, value in server.settings.hadoop_conf().items():
                    conf.set(key, value)
                bucket = server.create_bucket()
                measure(spark, "s3", f"s3a://{bucket}", args)
    spark.stop()
    print(f"1-minute load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
