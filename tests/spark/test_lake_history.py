"""A run's bookkeeping does not grow with the lake's age: the same requests after 100,000 earlier runs as after one.

The history is written synthetically through the store (tests/spark/lake_history.py): the ledger 100,000
one-offset runs leave behind, which is what a run reads, not 100,000 Spark jobs. Then a real run of the job
(Spark, the Liftbridge server, the local disk or the S3 gateway) lands the next offsets; its ledger requests,
counted by kind, must equal a run's on a lake with one earlier run, and its offsets land once. (The time ratio is
bench/bench_lake_history.py's: no timed assertion here.)
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from pyspark.sql import SparkSession

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.spark import ingest
from liftbridge_provider.spark.lake_store import CountingStore, HadoopStore
from tests.spark.lake_history import write_history
from tests.spark.lake_places import LakePlace, lake_place

__all__ = ["lake_place"]  # the fixture: each test runs on the local disk and on the S3 gateway

HISTORY = 100_000
NEW = 20  # offsets a run lands after the history


@pytest.fixture(scope="module")
def stream(client: LiftbridgeClient) -> str:
    """One partition, offsets 0 to HISTORY + 19; a lake's history ends at HISTORY, the run lands the rest."""
    name = f"aged-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name)
    for first in range(0, HISTORY + NEW, 20_000):
        count = min(20_000, HISTORY + NEW - first)
        client.publish_batch(name, [b"v"] * count, ack_policy="all")
    return name


def requests_of_a_run(
    spark: SparkSession, brokers: list[str], stream: str, output: str, history: int
) -> tuple[Counter[str], list[int]]:
    """The ledger requests of one run of the offsets after HISTORY on a lake whose ledger holds ``history``
    one-offset runs ending there, and the offsets the run landed."""
    store = HadoopStore(spark, output)
    write_history(store, f"{store.root}/stream={stream}", 0, history, HISTORY)
    counted = CountingStore(store)
    document = RangesDocument(stream, (OffsetRange(0, HISTORY, HISTORY + NEW),))
    argv = ["--brokers", ",".join(brokers), "--ranges", document.dumps(), "--output", output, "--min-partitions", "2"]
    outcome = ingest.run(spark, ingest.parse_args(argv), store=counted)
    assert outcome.problems == []
    assert outcome.gaps == [], "the history's offsets count as held"
    rows = spark.read.parquet(f"{output}/stream={stream}").select("offset").collect()
    return counted.counts, sorted(row["offset"] for row in rows)


def test_a_run_after_100000_runs_makes_the_requests_of_a_run_after_one(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, lake_place: LakePlace
) -> None:
    young, young_offsets = requests_of_a_run(spark, liftbridge_server.brokers, stream, lake_place.new_lake(), 1)
    aged, aged_offsets = requests_of_a_run(spark, liftbridge_server.brokers, stream, lake_place.new_lake(), HISTORY)
    assert young_offsets == aged_offsets == list(range(HISTORY, HISTORY + NEW)), "each new offset once"
    assert aged == young, f"requests by kind after {HISTORY:,} runs {dict(aged)}, after one {dict(young)}"
