"""Where the Parquet ingest's staging job spends its time as the partition count grows (issue 48).

    .venv/bin/python bench/bench_stage_split.py [--messages 200000] [--partitions 4,256] [--runs 3]

Starts one Liftbridge node on 127.0.0.1, publishes ``--messages`` values of 100 random bytes round-robin
over one stream per entry of ``--partitions``, and, in one ``local[2]`` SparkSession, reads every
partition's offsets as the ingest's staging job does (``spark/pieces.read_pieces``, one piece per
partition, ``maxPartitions=4``: two tasks per core), into three sinks, best of ``--runs`` each:

- ``noop``: Spark's noop sink, the read alone;
- ``spark-parquet``: the staging job's write (``partitionBy`` partition and piece, unsorted: one object per
  piece, through Spark's file writer and commit protocol);
- ``arrow-per-piece``: each task writes its rows of each piece as one Parquet file with pyarrow
  (``mapInArrow``), the rows grouped by piece in the task.

It prints each sink's time per partition count and the ratio of the largest count to the smallest: what
a write of one object per piece by the task itself would save against Spark's writer. Numbers only, no
assertions; the CPU model and load are printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine_line
from bench_lake_partitions import publish, spark_session

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.devserver import start_single
from liftbridge_provider.spark.pieces import read_pieces
from liftbridge_provider.spark.session_settings import unsorted_partitioned_writes

PIECE = "c"  # the piece tag column, as the staging job's


def per_piece_writer(root: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A mapInArrow function writing a task's rows of each piece as one Parquet file under ``root``."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        parts: dict[int, list[pa.Table]] = {}
        for batch in batches:
            table = pa.Table.from_batches([batch])
            for tag in pc.unique(table.column(PIECE)).to_pylist():
                parts.setdefault(tag, []).append(table.filter(pc.equal(table.column(PIECE), tag)))
        for tag, tables in parts.items():
            os.makedirs(f"{root}/{PIECE}={tag}", exist_ok=True)
            pq.write_table(pa.concat_tables(tables), f"{root}/{PIECE}={tag}/part.parquet")
            yield pa.RecordBatch.from_pylist([{PIECE: tag}], schema=pa.schema([(PIECE, pa.int64())]))

    return write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--partitions", default="4,256")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    counts = [int(p) for p in args.partitions.split(",")]
    print(machine_line())
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]), flush=True)
    spark = spark_session()
    best: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-stage-") as tmp, start_single() as server:
        documents = {}
        with LiftbridgeClient(server.brokers) as client:
            for count in counts:
                ends = publish(client, f"stage-{count}", args.messages, count, 100)
                documents[count] = RangesDocument(
                    f"stage-{count}", tuple(OffsetRange(p, 0, e) for p, e in enumerate(ends))
                )
        options = {"brokers": ",".join(server.brokers), "maxPartitions": "4"}

        def frame(count: int) -> DataFrame:
            pieces = list(documents[count].ranges)
            tags = {piece: index for index, piece in enumerate(pieces)}
            read = read_pieces(spark, f"stage-{count}", pieces, options, tags=tags, tag_column=PIECE)
            return read.withColumn("p", F.col("partition"))

        def noop(count: int, folder: str) -> None:
            frame(count).write.format("noop").mode("overwrite").save()

        def spark_parquet(count: int, folder: str) -> None:
            with unsorted_partitioned_writes(spark):
                writer = frame(count).write.partitionBy("p", PIECE).option("maxRecordsPerFile", 0)
                writer.mode("errorifexists").parquet(folder)

        def arrow_per_piece(count: int, folder: str) -> None:
            written = frame(count).mapInArrow(per_piece_writer(folder), f"{PIECE} long").collect()
            if len(written) != count:
                raise RuntimeError(f"{len(written)} pieces written, expected {count}")

        sinks = {"noop": noop, "spark-parquet": spark_parquet, "arrow-per-piece": arrow_per_piece}
        runs = 0
        for name, sink in sinks.items():
            for count in counts:
                for run in range(args.runs + 1):  # the first warms the sink up, not counted
                    runs += 1
                    started = time.perf_counter()
                    sink(count, f"{tmp}/{name}-{count}-{runs}")
                    seconds = time.perf_counter() - started
                    if run:
                        best[name, count] = min(best.get((name, count), seconds), seconds)
                print(f"{name:16s} {count:4d} partitions: {best[name, count]:.2f} s", flush=True)
    spark.stop()
    low, high = min(counts), max(counts)
    print(f"\n{args.messages:,} messages of 100 bytes, local[2], best of {args.runs}; ratio {high} / {low}:")
    for name in sinks:
        few, many = best[name, low], best[name, high]
        print(f"  {name:16s} {few:5.2f} s / {many:5.2f} s: {many / few:.2f}x")
    print(f"1-minute load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
