"""Publishing a piece never relies on an atomic folder rename: readers see each piece whole or not at all.

On S3A a folder rename is a copy of each file, then a delete. A driver that
dies in the middle used to leave a ``range=`` folder holding part of its piece,
which the next run took as published: the ledger said N rows, readers saw
fewer, and every later run exited 0. Every published piece is now one object,
copied whole from the staged one named by its commit.

Real Spark, a real Liftbridge server, the local disk and (where the gateway
is installed) the S3 gateway; the store below dies after the first object
copy of a rename, as S3A's rename does when the driver is killed there.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest
from pyspark.sql import SparkSession

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.spark import ingest
from liftbridge_provider.spark.lake_store import HadoopStore
from tests.spark.lake_places import LakePlace, lake_place

__all__ = ["lake_place"]  # the fixture, parametrized over the local disk and the S3 gateway


class DiesMidRename(BaseException):
    """The driver died inside a rename (raised in this process: nothing of the job runs after it)."""


class CopyThenDeleteStore(HadoopStore):
    """Renames as S3A does (each file copied, then the source deleted) and dies after the first copy."""

    def rename(self, source: str, target: str) -> bool:
        fs, jvm = self._fs, self._jvm
        source_path, target_path = self._path(source), self._path(target)
        files = [source_path] if fs.isFile(source_path) else [s.getPath() for s in fs.listStatus(source_path)]
        first = files[0]
        copy_to = target_path if fs.isFile(source_path) else jvm.org.apache.hadoop.fs.Path(target_path, first.getName())
        jvm.org.apache.hadoop.fs.FileUtil.copy(fs, first, fs, copy_to, False, self._conf)
        raise DiesMidRename(f"killed after copying {first} of {len(files)} file(s)")


@pytest.fixture(scope="module")
def stream(client: LiftbridgeClient) -> str:
    """One partition, offsets 0-199."""
    name = f"pub-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name)
    client.publish_batch(name, [f"v{i}".encode() for i in range(200)], ack_policy="all")
    return name


def run(spark: SparkSession, brokers: list[str], output: str, piece: RangesDocument, **kw: Any) -> Any:
    ranges = piece
    argv = ["--brokers", ",".join(brokers), "--ranges", ranges.dumps(), "--output", output, "--min-partitions", "2"]
    return ingest.run(spark, ingest.parse_args(argv), **kw)


def first_100(stream: str) -> RangesDocument:
    return RangesDocument(stream, (OffsetRange(0, 0, 100),))


def pieces_seen(spark: SparkSession, output: str, stream: str) -> dict[str, list[int]]:
    """What a reader sees: the offsets under each range folder."""
    rows = spark.read.parquet(f"{output}/stream={stream}").select("range", "offset").collect()
    seen: dict[str, list[int]] = {}
    for row in rows:
        seen.setdefault(str(row["range"]), []).append(int(row["offset"]))
    return {folder: sorted(offsets) for folder, offsets in seen.items()}


def assert_each_piece_whole(seen: dict[str, list[int]]) -> None:
    for folder, offsets in seen.items():
        start, end = map(int, folder.split("-"))
        assert offsets == list(range(start, end)), f"range={folder} holds {len(offsets)} of {end - start} offsets"


def test_a_driver_dying_mid_rename_leaves_no_partial_piece_and_the_next_run_finishes_it(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, lake_place: LakePlace
) -> None:
    """The run's pieces are read by two tasks (two files before, two one-object pieces now); the driver dies
    after the first object copy of its first publish. Readers must then see only whole pieces, and the next
    run (the same range: an Airflow retry) must leave each of the 100 offsets exactly once."""
    output = lake_place.new_lake()
    with pytest.raises(DiesMidRename):
        run(spark, liftbridge_server.brokers, output, first_100(stream), store=CopyThenDeleteStore(spark, output))
    assert_each_piece_whole(pieces_seen(spark, output, stream))
    outcome = run(spark, liftbridge_server.brokers, output, first_100(stream))
    assert outcome.problems == []
    seen = pieces_seen(spark, output, stream)
    assert_each_piece_whole(seen)
    offsets = sorted(o for folder in seen.values() for o in folder)
    assert Counter(offsets) == Counter(range(100)), "each offset exactly once"
    assert sum(e["rows"] for e in outcome.entries) == 100
