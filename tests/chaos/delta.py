"""The Delta table of a seed: the ranges frozen by the batch runs, ingested again in any order.

Every range document a freeze returned is kept. A ``delta`` step ingests some
of a stream's documents into the seed's one Delta table with the ingest
job's own ``run`` (``--format delta``), in a way the Parquet lake's batch
runs never do: in shuffled order, two at once, the same document twice, or
after a run that died between writing its files and committing them. The
oracle then checks the table holds no offset twice, every row is what was
published there, and every offset of a landed range that the stream holds is
in the table.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from pyspark.sql import SparkSession

from liftbridge_provider import fault_points
from liftbridge_provider.core.ranges import RangesDocument
from liftbridge_provider.spark import ingest
from tests.chaos.batch import PROBE, SPARK_OVERHEAD
from tests.chaos.lake import IngestFailed
from tests.chaos.oracle import LakeRow
from tests.chaos.store import SeedStore

MODES = ("order", "concurrent", "retry", "crash")
CRASH_POINT = "ingest.table_written"
NAME = "delta"  # the table's name on the seed's store


class DriverDied(BaseException):
    """Raised at the Delta job's commit point: nothing of the run happens after it, as after a kill."""


@dataclass
class DeltaLake:
    """The seed's Delta table (``delta`` on the seed's store); ``landed`` lists the documents whose ingest
    succeeded (the table holds them)."""

    store: SeedStore
    spark: SparkSession
    landed: list[RangesDocument] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ingest(
        self, brokers: list[str], document: RangesDocument, *, compacted: bool, skip_data_loss: bool, timeout: float
    ) -> list[dict[str, Any]]:
        """What ``ingest.main --format delta`` does, in this process; raises IngestFailed on the job's checks."""
        argv = ["--brokers", ",".join(brokers), "--ranges", document.dumps(), "--output", self.store.uri(NAME)]
        argv += ["--format", "delta", "--request-timeout", str(timeout), "--read-timeout", str(4 * timeout)]
        if compacted:
            argv.append("--compacted")
        if skip_data_loss:
            argv += ["--on-data-loss", "skip"]
        outcome = ingest.run(self.spark, ingest.parse_args(argv))
        if outcome.problems:
            raise IngestFailed("; ".join(outcome.problems))
        with self._lock:
            self.landed.append(document)
        return outcome.entries

    def ingest_dying_before_commit(self, brokers: list[str], document: RangesDocument, **options: Any) -> bool:
        """A run whose driver dies after Spark wrote its files, before the Delta commit (the files stay);
        False when it had nothing to write, so never reached that point."""

        def die(_: str) -> None:
            raise DriverDied(CRASH_POINT)

        try:
            with fault_points.armed(CRASH_POINT, die):
                self.ingest(brokers, document, **options)
        except DriverDied:
            return True
        return False

    def rows(self) -> list[LakeRow]:
        """Every row a Delta reader sees (empty before the first run created the table)."""
        try:
            delta = DeltaTable(self.store.delta_uri(NAME), storage_options=self.store.delta_options())
        except TableNotFoundError:
            return []
        data = delta.to_pyarrow_table(columns=["key", "value", "stream", "partition", "offset"])
        if data.num_rows and pc.any(pc.is_null(data.column("offset"))).as_py():
            raise ValueError(f"the Delta table {self.store.uri(NAME)} has a row without an offset")
        return [
            LakeRow(r["stream"], r["partition"], r["offset"], r["key"] or None, r["value"], "delta", 0, 2**63 - 1)
            for r in data.to_pylist()
        ]


def draw_documents(rng: random.Random, frozen: list[RangesDocument], mode: str) -> list[RangesDocument]:
    """Which of a stream's frozen documents with offsets a step ingests, in the order it does (pure); mode
    ``all`` (the drain's) takes every one, shuffled."""
    frozen = [d for d in frozen if d.total > 0]
    if not frozen:
        return []
    if mode == "all":
        return rng.sample(frozen, len(frozen))
    if mode == "order":
        chosen = rng.sample(frozen, min(len(frozen), rng.randint(1, 3)))
        rng.shuffle(chosen)
        return chosen
    if mode == "concurrent":
        return [rng.choice(frozen), rng.choice(frozen)]
    return [rng.choice(frozen)]  # retry and crash: one document, ingested twice


def deadline(document: RangesDocument, request_timeout: float) -> float:
    """Seconds a Delta ingest of ``document`` may take: as the batch path's ingest, plus the commit."""
    ranges = sum(1 for r in document.ranges if r.count > 0)
    return SPARK_OVERHEAD + ranges * (6 * request_timeout + PROBE) + 10
