"""Reading many offset pieces in one Spark job: what the Parquet and the Delta ingest share.

A ranges document holds one range per partition, so pieces are grouped into
rounds of at most one piece per partition, each round read as one
``liftbridge`` DataFrame, and the rounds unioned: Spark then runs one job
whose tasks cover every piece (each task reads one slice of one piece). A
column may tag each row with the piece it belongs to, so one write can send
each piece's rows to its own folder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from liftbridge_provider.core.ranges import OffsetRange, RangesDocument


def rounds(pieces: Sequence[OffsetRange]) -> list[list[OffsetRange]]:
    """``pieces`` grouped so that no group holds two pieces of one partition (first fit, in order).

    The first group without a piece of the partition is the one after its partition's earlier pieces: a
    partition's k-th piece goes to group k, found by a count instead of a scan of every group (which took
    time growing with the square of the pieces)."""
    grouped: list[list[OffsetRange]] = []
    seen: dict[int, int] = {}
    for piece in pieces:
        index = seen.get(piece.partition, 0)
        seen[piece.partition] = index + 1
        if index == len(grouped):
            grouped.append([])
        grouped[index].append(piece)
    return grouped


def read_pieces(
    spark: SparkSession,
    stream: str,
    pieces: Sequence[OffsetRange],
    options: Mapping[str, str],
    *,
    tags: Mapping[OffsetRange, int] | None = None,
    tag_column: str = "piece",
) -> DataFrame:
    """Every piece's messages as one DataFrame (read by one Spark job when written); with ``tags``, a
    ``tag_column`` holds each row's piece tag (an int per piece)."""
    frames = []
    for group in rounds(pieces):
        document = RangesDocument(stream, tuple(group))
        frame = spark.read.format("liftbridge").options(**options, ranges=document.dumps()).load()
        if tags is not None:
            frame = frame.withColumn(tag_column, _tag_of_partition({p.partition: tags[p] for p in group}))
        frames.append(frame)
    return reduce(DataFrame.unionByName, frames)


def _tag_of_partition(tags: Mapping[int, int]) -> Column:
    """A column that maps the row's partition to its piece's tag (one piece per partition in a round).

    One SQL expression of integer literals, parsed by the JVM in one call: the same map built from a ``lit``
    column per key and per value cost two py4j round trips per partition (512 for 256 partitions, a tenth
    of such a run's time on the driver)."""
    pairs = ", ".join(f"{int(partition)}, {int(tag)}" for partition, tag in sorted(tags.items()))
    return F.expr(f"map({pairs})[`partition`]")
