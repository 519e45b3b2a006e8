"""A ``liftbridge`` stream query run to the end of what is there (``availableNow``), for the writer tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession


def run_available_now(
    spark: SparkSession,
    brokers: list[str],
    stream: str,
    write: Callable[[Any, int], None],
    checkpoint: Path,
    *,
    max_offsets: int,
) -> None:
    """Read ``stream`` from its earliest offset in micro-batches of at most ``max_offsets`` messages into
    ``foreachBatch(write)``, checkpointed at ``checkpoint``, until what is there now is done (at most 300 s);
    fails on the query's exception."""
    frame = spark.readStream.format("liftbridge").options(
        brokers=",".join(brokers), stream=stream, startingOffsets="earliest", maxOffsetsPerTrigger=str(max_offsets)
    )
    query = (
        frame.load()
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
