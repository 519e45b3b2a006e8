"""A streaming query for the restart test: liftbridge -> Parquet file sink, availableNow, rate-limited.

    python stream_to_parquet.py BROKERS STREAM OUTPUT CHECKPOINT MAX_OFFSETS

Each micro-batch is slowed down (a Python UDF sleeps once per batch and partition) so that the test can kill
the process while the query is half done.
"""

from __future__ import annotations

import sys
import time

from pyspark.sql import functions
from pyspark.sql.types import LongType

from tests.spark_session import local_spark


@functions.udf(LongType())
def slowly(offset: int) -> int:
    if offset % 100 == 0:
        time.sleep(0.3)
    return offset


def main() -> None:
    brokers, stream, output, checkpoint, max_offsets = sys.argv[1:6]
    spark = local_spark("liftbridge-stream-restart")
    frame = (
        spark.readStream.format("liftbridge")
        .option("brokers", brokers)
        .option("stream", stream)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", max_offsets)
        .load()
        .withColumn("offset", slowly("offset"))
    )
    query = (
        frame.writeStream.format("parquet")
        .option("path", output)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    print(f"BATCHES {len(query.recentProgress)}")


if __name__ == "__main__":
    main()
