"""Ingest frozen offset ranges into Parquet range folders through the lake's claim ledger, in one Spark job.

A run:

1. **claims** every range's offsets that no claim covers yet (one claim per
   piece, ``liftbridge_provider/core/lake.py``), after finishing any publish a
   crash interrupted, and gathers every open piece overlapping its ranges
   (its own, or one a crashed or slower run left uncommitted);
2. **reads all open pieces in one Spark job** (``pieces.read_pieces``: its
   tasks cover every piece, each cut into slices so every core reads) and
   writes each piece's rows into the run's own staged folder for that piece,
   ``_staging/<run>/p=<partition>/claim=<seq>/``;
3. takes each piece's rows and smallest and largest offset from the footers
   of the files it wrote (no second Spark job), checks them, and **commits**
   each checked piece by creating its commit file exclusively (one staged
   folder wins), then **publishes** the winner by renaming it to
   ``partition=<p>/range=<start>-<end>``.

A crash at any point is repaired by the next run whose range overlaps (an
open claim is written again, a committed one published). Layout and
guarantees: docs/spark.md, "Exactly-once in the lake: the claim ledger".
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from liftbridge_provider import fault_points
from liftbridge_provider.core.lake import Claim, Commit, LakeError, Ledger, Outcome, plan_write, problems
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.spark.lake_store import HadoopStore, PieceStats
from liftbridge_provider.spark.pieces import read_pieces
from liftbridge_provider.spark.session_settings import unsorted_partitioned_writes

log = logging.getLogger("liftbridge.ingest")

PARTITION_TAG = "p"  # the staged folders' partition level (the rows keep their own "partition" column)
CLAIM_TAG = "claim"


@dataclass(frozen=True)
class Job:
    """What every piece of one run shares."""

    store: HadoopStore
    stream: str
    stream_folder: str
    run: str
    options: dict[str, str]
    compacted: bool
    head_loss_ok: bool

    @property
    def staging_root(self) -> str:
        """This run's staged folders, relative to the stream's folder."""
        return f"_staging/{self.run}"

    def staged(self, claim: Claim) -> str:
        """Where this run stages ``claim``'s rows, relative to the stream's folder."""
        return f"{self.staging_root}/{PARTITION_TAG}={claim.partition}/{CLAIM_TAG}={claim.seq}"


def entry_of(job: Job, claim: Claim) -> dict[str, Any]:
    assert claim.commit is not None
    return {
        "partition": claim.partition,
        "start": claim.start,
        "end": claim.end,
        "rows": claim.commit.rows,
        "min_offset": claim.commit.min_offset,
        "max_offset": claim.commit.max_offset,
        "path": f"{job.stream_folder}/{claim.folder}",
        "claim": claim.seq,
        "run": claim.commit.run,
    }


def publish(job: Job, claim: Claim) -> None:
    """Move a committed claim's winning staged folder to its range folder, unless that happened already.

    The range folder is checked before the staged one: a rename is atomic, so
    seeing the staged folder after missing the range folder means nobody moved it yet.
    """
    assert claim.commit is not None
    final = f"{job.stream_folder}/{claim.folder}"
    if job.store.exists(final):
        return
    staged = f"{job.stream_folder}/{claim.commit.staging}"
    if job.store.exists(staged):
        job.store.mkdirs(final.rsplit("/", 1)[0])
        if job.store.rename(staged, final):
            log.info("partition %d [%d, %d): published %s", claim.partition, claim.start, claim.end, final)
            return
    if not job.store.exists(final):
        raise LakeError(
            f"claim {claim.seq} of partition {claim.partition} is committed, but neither {final} nor its "
            f"staged folder {staged} exists: the lake lost offsets [{claim.start}, {claim.end})"
        )


def claim_all(job: Job, ranges: Sequence[OffsetRange]) -> tuple[dict[int, Ledger], list[Claim]]:
    """Each range's ledger, after claiming what no claim covers, and every open piece overlapping a range."""
    ledgers: dict[int, Ledger] = {}
    open_claims: list[Claim] = []
    for wanted in ranges:
        ledger = ledgers[wanted.partition] = Ledger(job.store, job.stream_folder, wanted.partition, job.run)
        for claim in ledger.claims():
            if claim.committed:
                publish(job, claim)  # finish a rename that a crash interrupted
        open_claims += ledger.claim(wanted).write
    return ledgers, open_claims


def stage_all(spark: SparkSession, job: Job, claims: Sequence[Claim]) -> dict[Claim, PieceStats]:
    """Read every claim's piece in one Spark job into this run's staged folder for it; each piece's stats."""
    pieces = [OffsetRange(c.partition, c.start, c.end) for c in claims]
    tags = {piece: claim.seq for piece, claim in zip(pieces, claims, strict=True)}
    frame = read_pieces(spark, job.stream, pieces, job.options, tags=tags, tag_column=CLAIM_TAG)
    frame = frame.withColumn(PARTITION_TAG, F.col("partition"))  # the rows keep their own partition column
    root = f"{job.stream_folder}/{job.staging_root}"
    with unsorted_partitioned_writes(spark):  # a task's rows are one piece's: nothing to sort
        frame.write.partitionBy(PARTITION_TAG, CLAIM_TAG).mode("errorifexists").parquet(root)
    stats = {}
    for claim in claims:
        staged = f"{job.stream_folder}/{job.staged(claim)}"
        if job.store.exists(staged):
            stats[claim] = job.store.parquet_stats(staged, "offset")
        else:  # no rows (compaction or retention emptied the piece): an empty folder stands for it
            job.store.mkdirs(staged)
            stats[claim] = PieceStats(0, None, None)
    return stats


def commit_piece(job: Job, ledger: Ledger, claim: Claim, stats: PieceStats) -> list[str]:
    """Check a staged piece and commit it unless another run did; publish the winner; its problems."""
    staging = job.staged(claim)
    commit = Commit(staging, stats.rows, stats.min_offset, stats.max_offset, job.run)
    found = problems([entry_of(job, dataclasses.replace(claim, commit=commit))], job.compacted, job.head_loss_ok)
    if found:
        job.store.delete(f"{job.stream_folder}/{staging}")
        return [f"{problem} (not committed; claim {claim.seq} stays open for a rerun)" for problem in found]
    winner = ledger.commit(claim, commit)
    if winner.staging != staging:
        job.store.delete(f"{job.stream_folder}/{staging}")  # another run committed this piece first
    fault_points.reached("ingest.decided")
    publish(job, dataclasses.replace(claim, commit=winner))
    log.info(
        "partition %d [%d, %d): %d rows, claim %d (%s)",
        claim.partition,
        claim.start,
        claim.end,
        winner.rows,
        claim.seq,
        "written" if winner.staging == staging else f"committed by run {winner.run}",
    )
    return []


def settle(job: Job, ledger: Ledger, wanted: OffsetRange) -> Outcome:
    """What the lake holds of ``wanted`` once this run is done: its pieces, problems and gaps."""
    final = plan_write(ledger.claims(), wanted)
    for claim in final.held:
        publish(job, claim)  # another run may have committed without publishing yet
    gaps = [f"partition {wanted.partition}: the lake misses offsets [{s}, {e})" for s, e in final.gaps]
    entries = [entry_of(job, claim) for claim in final.held]
    found = problems(entries, job.compacted, job.head_loss_ok)
    if not final.settled and not found:
        open_pieces = [(c.seq, c.start, c.end) for c in final.write] + [(None, r.start, r.end) for r in final.claim]
        found.append(f"partition {wanted.partition}: pieces (claim, start, end) {open_pieces} are not committed")
    return Outcome(entries, found, gaps, "")


def ingest_parquet(spark: SparkSession, job: Job, document: RangesDocument) -> Outcome:
    """Claim, read in one Spark job, stage, commit and publish every open piece of ``document``'s ranges."""
    ranges = [r for r in document.ranges if r.count > 0]
    ledgers, open_claims = claim_all(job, ranges)
    fault_points.reached("ingest.claimed")
    found: list[str] = []
    if open_claims:
        stats = stage_all(spark, job, open_claims)
        fault_points.reached("ingest.staged")
        for claim in open_claims:
            found += commit_piece(job, ledgers[claim.partition], claim, stats[claim])
        job.store.delete(f"{job.stream_folder}/{job.staging_root}")  # what is left: Spark's marker files
    total = Outcome([], found, [], "")
    for wanted in ranges:
        outcome = settle(job, ledgers[wanted.partition], wanted)
        total.entries += outcome.entries
        total.problems += outcome.problems
        total.gaps += outcome.gaps
    return total
