"""The standalone phase of ``bench_spark.py --standalone``, in its own process: a client-mode application on
the loopback cluster runs a plain ``spark.read.format("liftbridge")...write.parquet`` and the ingest job over
the same offsets, ``--runs`` times interleaved, with Spark's event log on; prints one JSON line with each
run's seconds and, per run, which executors ran tasks and for how long at the same time."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from _standalone import overlap_seconds, task_spans, timeline
from pyspark.sql import SparkSession

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.spark import ingest


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("--master", "--brokers", "--stream", "--workdir"):
        parser.add_argument(name, required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    workdir = Path(args.workdir)
    events = workdir / "events"
    events.mkdir(parents=True, exist_ok=True)
    spark = (
        SparkSession.builder.master(args.master)
        .appName("bench-spark-standalone")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.ui.enabled", "false")
        .config("spark.eventLog.enabled", "true")
        .config("spark.eventLog.dir", events.as_uri())
        .config("spark.eventLog.compress", "false")  # plain JSON lines, read by _standalone.task_spans
        .config("spark.eventLog.rolling.enabled", "false")
        .config("spark.executor.cores", "1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    with LiftbridgeClient(args.brokers.split(",")) as client:
        ends = [client.fetch_partition_metadata(args.stream, p).high_watermark + 1 for p in range(args.partitions)]
    document = RangesDocument(args.stream, tuple(OffsetRange(p, 0, end) for p, end in enumerate(ends)))
    options = {"brokers": args.brokers, "ranges": document.dumps()}
    results: dict[str, list[dict[str, object]]] = {"plain": [], "ingest": []}
    job_ids: dict[tuple[str, int], set[int]] = {}
    tracker = spark.sparkContext.statusTracker()
    for run in range(args.runs):
        for kind in ("plain", "ingest"):
            group = f"{kind}-{run}"
            out = workdir / group
            spark.sparkContext.setJobGroup(group, group)
            started = time.perf_counter()
            if kind == "plain":
                spark.read.format("liftbridge").options(**options).load().write.parquet(str(out))
            else:
                argv = ["--brokers", args.brokers, "--ranges", document.dumps(), "--output", str(out)]
                outcome = ingest.run(spark, ingest.parse_args(argv))
            seconds = time.perf_counter() - started
            job_ids[(kind, run)] = set(tracker.getJobIdsForGroup(group))
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
            if kind == "plain":  # counted outside the timed group
                rows = int(spark.read.parquet(str(out)).count())
            else:
                rows = sum(entry["rows"] for entry in outcome.entries)
            results[kind].append({"seconds": seconds, "rows": rows, "jobs": sorted(job_ids[(kind, run)])})
            shutil.rmtree(out, ignore_errors=True)
            print(f"  .. standalone run {run + 1}: {kind:<6} {seconds:7.2f} s", file=sys.stderr, flush=True)
    spark.stop()
    spans = task_spans(events)
    for kind, runs in results.items():
        for run, result in enumerate(runs):
            mine = [s for s in spans if s.job in job_ids[(kind, run)]]
            result["executors"] = sorted({s.executor for s in mine})
            result["together_seconds"] = round(overlap_seconds(mine), 2)
            result["timeline"] = timeline(mine)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
