"""The Parquet lake of a seed: written by the ingest job's functions, read back with pyarrow.

``Lake.ingest`` does what ``ingest.main`` does (``ingest.run``: fenced pieces
through the lake's ledger, the manifest, the job's own checks), on the
harness's one shared SparkSession instead of a new one; a problem fails the
ingest, as the job's exit status would. The lake is on the seed's store
(tests/chaos/store.py: a local folder or an S3 bucket).
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from liftbridge_provider.core.ranges import RangesDocument
from liftbridge_provider.spark import ingest
from liftbridge_provider.spark.lake_store import LakeStore
from tests.chaos.oracle import LakeRow
from tests.chaos.store import SeedStore

FOLDER = re.compile(r"stream=(?P<stream>[^/]+)/partition=(?P<partition>\d+)/range=(?P<start>\d+)-(?P<end>\d+)$")


class IngestFailed(Exception):
    """The ingest job would have exited non-zero: its own checks found problems."""


class Lake:
    """One lake per seed, ``lake`` on its store; ``spark`` is shared by every seed of the session."""

    NAME = "lake"

    def __init__(self, store: SeedStore, spark: SparkSession) -> None:
        self.store = store
        self.root = store.uri(self.NAME)
        self.spark = spark

    def ingest(
        self,
        brokers: list[str],
        document: RangesDocument,
        *,
        compacted: bool,
        skip_data_loss: bool,
        request_timeout: float,
        lake_store: LakeStore | None = None,
    ) -> list[dict[str, Any]]:
        """Ingest every non-empty range of ``document``; returns the manifest entries or raises IngestFailed.
        ``lake_store``: the job's files through this store (a fault proxy) instead of its own."""
        argv = ["--brokers", ",".join(brokers), "--ranges", document.dumps(), "--output", self.root]
        argv += ["--request-timeout", str(request_timeout), "--read-timeout", str(4 * request_timeout)]
        if compacted:
            argv.append("--compacted")
        if skip_data_loss:
            argv += ["--on-data-loss", "skip"]
        outcome = ingest.run(self.spark, ingest.parse_args(argv), store=lake_store)
        if outcome.problems:
            raise IngestFailed("; ".join(outcome.problems))
        return outcome.entries

    def cancel(self) -> None:
        """Cancel every Spark job still running (after an ingest outlived its deadline)."""
        self.spark.sparkContext.cancelAllJobs()

    def rows(self) -> list[LakeRow]:
        """Every row of every Parquet file in the lake, with the range folder it lies in."""
        found = []
        for path in self.store.files(self.NAME):
            relative = self.store.relative(self.NAME, path)
            if not relative.endswith(".parquet") or any(part.startswith(("_", ".")) for part in relative.split("/")):
                continue  # the ledger, staging folders of unfinished runs: not data, as for Spark's readers
            match = FOLDER.search(relative.rpartition("/")[0])
            if match is None:  # the layout changed: the oracle must learn it rather than see an empty lake
                raise ValueError(f"lake file {path} is not under stream=/partition=/range=<start>-<end>/")
            folder = f"partition={match['partition']}/range={match['start']}-{match['end']}"
            table = pq.read_table(
                path, columns=["key", "value", "stream", "partition", "offset"], filesystem=self.store.filesystem
            )
            for record in table.to_pylist():
                found.append(
                    LakeRow(
                        stream=record["stream"],
                        partition=record["partition"],
                        offset=record["offset"],
                        key=record["key"] or None,
                        value=record["value"],
                        folder=folder,
                        start=int(match["start"]),
                        end=int(match["end"]),
                    )
                )
        return found
