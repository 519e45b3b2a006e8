"""A Spark task's read (``read_slice``) whose Subscribe calls end while it reads: every offset exactly once."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.core.spark_planning import Slice
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.spark import reader
from liftbridge_provider.spark.options import parse_options

MESSAGES = 60_000


def test_a_slice_read_longer_than_one_call_lands_every_offset_once(
    liftbridge_server: DevServer, client: LiftbridgeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task's Subscribe call lasts at most the retention probe (5 s); a slice that took longer was read on
    by a new call from the last offset of the last full batch, and the rows of the batch being built came
    again: plain Spark -> Parquet wrote 1,013,311 rows for 1,000,000 offsets on a 2-worker cluster. With a
    probe of 0.1 s, calls end many times during this read, in the middle of batches."""
    name = f"spark-reopen-{uuid.uuid4().hex[:6]}"
    client.create_stream(name, name)
    client.publish_batch(name, [b"v%d" % i for i in range(MESSAGES)], ack_policy="all")
    monkeypatch.setattr(reader, "RETENTION_PROBE", 0.1)
    options = parse_options({"brokers": ",".join(liftbridge_server.brokers), "ranges": "{}", "batchSize": "500"})
    offsets: list[int] = []
    for batch in reader.read_slice(options, name, Slice(0, 0, MESSAGES), reader.arrow_schema()):
        offsets += batch.column("offset").to_pylist()
    repeated = sorted(offset for offset, count in Counter(offsets).items() if count > 1)
    assert not repeated, f"{len(repeated)} offsets landed more than once, e.g. {repeated[:5]}"
    assert offsets == list(range(MESSAGES))
