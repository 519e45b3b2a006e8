"""Ingest frozen offset ranges into Parquet through the lake's claim ledger, in one Spark job.

A run:

1. for each partition (at once, on a pool of driver threads): publishes what
   a crash left committed, then **claims** every range's offsets that no claim
   covers yet, in pieces sized so that the run's new offsets make at least one
   piece per core (``core/lake_ledger.py``), and gathers every open piece
   overlapping its range (its own, or one a crashed or slower run left);
2. **reads all open pieces in one Spark job** (``pieces.read_pieces``): each
   piece is read by one task, so its rows are one staged Parquet object, which
   the task writes itself and describes (rows, bytes, smallest and largest
   offset: ``spark/piece_writer.py``), or, where pyarrow cannot write the lake,
   Spark's writer does and one listing and each object's footer describe them
   (no second Spark job either way);
3. for each partition (at once): checks each piece, **commits** it by creating
   its commit file exclusively (one staged object wins), **publishes** the
   winner by moving that one object to ``partition=<p>/range=<start>-<end>/``
   (it appears whole), then **compacts** the partition's ledger (folds the
   committed prefix into a checkpoint) and reports what the lake holds.

A crash at any point is repaired by the next run whose range overlaps (an
open claim is written again, a committed one published). Layout and
guarantees: docs/spark.md, "Exactly-once in the lake: the claim ledger".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from liftbridge_provider import fault_points
from liftbridge_provider.core.errors import InvalidArgumentError
from liftbridge_provider.core.lake import Claim, Commit, LakeError, Outcome, piece_size, problems
from liftbridge_provider.core.lake_ledger import Ledger, LedgerState
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.core.s3_sources import s3_location
from liftbridge_provider.spark.lake_store import HadoopStore, LakeStore, PieceStats
from liftbridge_provider.spark.piece_writer import CODECS, STATS_SCHEMA, TIMESTAMPS, StagingTarget, stage_pieces
from liftbridge_provider.spark.pieces import read_pieces
from liftbridge_provider.spark.s3_session import s3a_encrypts, session_s3_settings
from liftbridge_provider.spark.session_settings import unsorted_partitioned_writes

log = logging.getLogger("liftbridge.ingest")

PARTITION_TAG = "p"  # the staged folders' partition level (the rows keep their own "partition" column)
CLAIM_TAG = "claim"
DRIVER_THREADS = 16
"""Driver threads for the per-partition ledger work (py4j gives each Python thread its own connection)."""

PACKED_TASKS = 2
"""Tasks per core a run's pieces are packed into when there are more pieces than that (source option
``maxPartitions``): a Spark task costs tens of milliseconds of its own, so 256 one-partition pieces in 256
tasks cost seconds more than the same rows in 4."""

NO_ROWS = PieceStats(0, None, None)

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Job:
    """What every piece of one run shares.

    ``tasks``: the pieces a run's new offsets are cut into at least (the
    cluster's cores, or ``--min-partitions``); ``max_records``: at most this
    many offsets per piece (``--max-records-per-partition``; None: no limit).
    """

    store: LakeStore
    stream: str
    stream_folder: str
    run: str
    options: dict[str, str]
    compacted: bool
    head_loss_ok: bool
    tasks: int = 1
    max_records: int | None = None
    threads: int = DRIVER_THREADS

    @property
    def staging_root(self) -> str:
        """This run's staged objects, relative to the stream's folder."""
        return f"_staging/{self.run}"

    def staged_folder(self, claim: Claim) -> str:
        """Where this run stages ``claim``'s rows (one object), relative to the stream's folder."""
        return f"{self.staging_root}/{PARTITION_TAG}={claim.partition}/{CLAIM_TAG}={claim.seq}"

    def ledger(self, partition: int) -> Ledger:
        return Ledger(self.store, self.stream_folder, partition, self.run, step=fault_points.reached)


def each(job: Job, work: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``work`` on every item on the driver's thread pool (one partition's ledger per item), in order."""
    listed = list(items)
    if len(listed) <= 1:
        return [work(item) for item in listed]
    with ThreadPoolExecutor(min(job.threads, len(listed)), thread_name_prefix="lake") as pool:
        return list(pool.map(work, listed))


def entry_of(job: Job, claim: Claim) -> dict[str, Any]:
    return piece_entry(job.stream_folder, claim)


def piece_entry(stream_folder: str, claim: Claim) -> dict[str, Any]:
    """A committed piece as the manifest and the checks list it."""
    assert claim.commit is not None
    path = claim.published_path
    return {
        "partition": claim.partition,
        "start": claim.start,
        "end": claim.end,
        "rows": claim.commit.rows,
        "min_offset": claim.commit.min_offset,
        "max_offset": claim.commit.max_offset,
        "path": f"{stream_folder}/{path}" if path else None,
        "claim": claim.seq,
        "run": claim.commit.run,
    }


def claim_range(job: Job, ledger: Ledger, wanted: OffsetRange, size: int) -> tuple[list[Claim], LedgerState]:
    """Publish the partition's committed pieces a crash left unpublished, then claim what no claim covers of
    ``wanted``; every open piece overlapping it, to write, and the ledger's state they came from."""
    state = ledger.read()
    for claim in state.recent:
        if claim.committed:
            ledger.publish(claim)  # finish a publish that a crash interrupted
    plan, state = ledger.claim(wanted, size=size, state=state)
    return list(plan.write), state


def stage_all(spark: SparkSession, job: Job, claims: Sequence[Claim]) -> dict[Claim, tuple[str, int, PieceStats]]:
    """Read every claim's piece in one Spark job, one task and one object each, into this run's staging folder;
    each piece's staged object (relative to the stream's folder; "" when it has no rows), bytes and stats.

    The tasks write the objects themselves where pyarrow reaches the lake (``spark/piece_writer.py``);
    elsewhere Spark's writer does, and the objects are found by one listing and their footers read."""
    pieces = [OffsetRange(c.partition, c.start, c.end) for c in claims]
    tags = {piece: claim.seq for piece, claim in zip(pieces, claims, strict=True)}
    options = {k: v for k, v in job.options.items() if k not in ("minPartitions", "maxRecordsPerPartition")}
    options["maxPartitions"] = str(PACKED_TASKS * job.tasks)  # many small pieces: whole, a few per task
    # Checked already: every range's end committed before anything was claimed (ingest.check_ends_committed),
    # and each piece's rows are judged before its commit (commit_partition). A piece another run claimed may
    # end past this run's range: its task checks its end on silence (read_slice), and sees a head retention
    # removed. Planning would ask two requests per piece again (one a read of the oldest offset).
    options["checkRanges"] = "false"
    frame = read_pieces(spark, job.stream, pieces, options, tags=tags, tag_column=CLAIM_TAG)
    root = f"{job.stream_folder}/{job.staging_root}"
    target = staging_target(spark, job)
    if target is not None:
        try:
            return _staged_by_tasks(job, frame, target, claims)
        except Exception as exc:  # py4j's error carries the task's own traceback
            said = next((line for line in str(exc).splitlines() if "AWS Error" in line), None)
            if target.s3 is None or said is None:
                raise
            log.warning("pyarrow could not write to S3 (%s); staging through Spark's S3A writer", said.strip())
            job.store.delete(root)  # what the failed attempts left
    frame = frame.withColumn(PARTITION_TAG, F.col("partition"))  # the rows keep their own partition column
    with unsorted_partitioned_writes(spark):  # a task's rows are one piece's: nothing to sort
        writer = frame.write.partitionBy(PARTITION_TAG, CLAIM_TAG).option("maxRecordsPerFile", 0)
        writer.mode("errorifexists").parquet(root)
    staged: dict[str, list[tuple[str, int]]] = {}
    for relative, size in job.store.list_files(root):
        folder, _, name = relative.rpartition("/")
        if name.endswith(".parquet") and not name.startswith(("_", ".")):
            staged.setdefault(f"{job.staging_root}/{folder}", []).append((f"{job.staging_root}/{relative}", size))

    def stats_of(claim: Claim) -> tuple[str, int, PieceStats]:
        objects = staged.get(job.staged_folder(claim), [])
        if len(objects) == 1:
            path, size = objects[0]
            return path, size, job.store.parquet_stats(f"{job.stream_folder}/{path}", "offset")
        return _one_object(claim, [(path, size, NO_ROWS) for path, size in objects])

    return dict(zip(claims, each(job, stats_of, claims), strict=True))


def _staged_by_tasks(
    job: Job, frame: DataFrame, target: StagingTarget, claims: Sequence[Claim]
) -> dict[Claim, tuple[str, int, PieceStats]]:
    """Run the staging job whose tasks write the pieces (``spark/piece_writer.py``) and take what they returned,
    once one listing of the staging folder through the lake's own store shows each object with its size:
    LakeError, before anything is committed, when it does not (a ``file:`` lake on a cluster whose executors
    do not share the driver's disk)."""
    with warnings.catch_warnings():  # mapInArrow checks pandas, which this job does not use
        warnings.filterwarnings("ignore", "PySpark does not yet fully support pandas", FutureWarning)
        rows = frame.mapInArrow(stage_pieces(target), STATS_SCHEMA).collect()
    returned: dict[tuple[int, int], list[tuple[str, int, PieceStats]]] = {}
    for row in rows:
        stats = PieceStats(row["rows"], row["min_offset"], row["max_offset"])
        returned.setdefault((row["partition"], row["claim"]), []).append((row["path"], row["bytes"], stats))
    if returned:
        seen = dict(job.store.list_files(f"{job.stream_folder}/{job.staging_root}"))
        for (partition, seq), objects in returned.items():
            for path, size, _ in objects:
                found = seen.get(path.removeprefix(job.staging_root + "/"))
                if found != size:
                    raise LakeError(
                        f"piece {seq} of partition {partition}: a task wrote {path} ({size} bytes), and the lake's "
                        f"filesystem shows {'no such object' if found is None else f'{found} bytes'} at "
                        f"{job.stream_folder}: on a cluster, a file: lake must be on storage the driver and every "
                        "executor share, at the same path"
                    )
    return {claim: _one_object(claim, returned.get((claim.partition, claim.seq), [])) for claim in claims}


def _one_object(claim: Claim, objects: list[tuple[str, int, PieceStats]]) -> tuple[str, int, PieceStats]:
    """The one staged object of ``claim``'s piece; none: the piece has no rows (compaction or retention emptied
    it), nothing to publish; LakeError for more than one (a piece is one object)."""
    if not objects:
        return "", 0, NO_ROWS
    if len(objects) > 1:
        raise LakeError(f"piece {claim.seq} of partition {claim.partition} was staged as {len(objects)} objects")
    return objects[0]


def staging_target(spark: SparkSession, job: Job) -> StagingTarget | None:
    """Where the tasks stage pieces with pyarrow: the lake on a local disk, or on S3 with settings pyarrow can
    sign with; None (Spark's writer) for another filesystem, S3 credentials only S3A's providers know, S3A's
    encryption, or a codec or timestamp type pyarrow does not write alike."""
    codec = CODECS.get(str(spark.conf.get("spark.sql.parquet.compression.codec", "snappy")).lower())
    timestamps = str(spark.conf.get("spark.sql.parquet.outputTimestampType", "INT96")).upper()
    if codec is None or timestamps not in TIMESTAMPS:
        return None
    root = f"{job.stream_folder}/{job.staging_root}"
    if job.store.scheme == "file":
        return StagingTarget(job.store.local_path(root), job.staging_root, CLAIM_TAG, codec, timestamps)
    location = s3_location(root)
    if location is None or s3a_encrypts(spark, location[0]):
        return None
    try:
        settings = session_s3_settings(spark, root, os.environ)
    except InvalidArgumentError as exc:
        log.info("staging through Spark's writer: %s", exc)
        return None
    if settings is None:
        return None
    bucket, key = location
    return StagingTarget(f"{bucket}/{key}", job.staging_root, CLAIM_TAG, codec, timestamps, s3=settings)


def commit_partition(
    job: Job, ledger: Ledger, staged: dict[Claim, tuple[str, int, PieceStats]], known: LedgerState
) -> tuple[list[str], LedgerState | None]:
    """Check each staged piece of one partition, commit the good ones unless another run did, publish the
    winners; the problems found (a failed piece is not committed: its claim stays open for a rerun), and the
    ledger's state after when nothing but this run changed it since ``known``."""
    found, commits = [], {}
    for claim, (path, size, stats) in staged.items():
        commit = Commit(path, stats.rows, stats.min_offset, stats.max_offset, job.run, size)
        wrong = problems([entry_of(job, dataclasses.replace(claim, commit=commit))], job.compacted, job.head_loss_ok)
        if wrong:
            if path:
                job.store.delete(f"{job.stream_folder}/{path}")
            found += [f"{problem} (not committed; claim {claim.seq} stays open for a rerun)" for problem in wrong]
        else:
            commits[claim] = commit
    winners, state = ledger.commit_all(commits, known=known)
    fault_points.reached("ingest.decided")
    for claim, commit in commits.items():
        winner = winners[claim.seq]
        if winner != commit:
            if commit.staging:
                job.store.delete(f"{job.stream_folder}/{commit.staging}")  # another run committed it first
        else:
            ledger.publish(dataclasses.replace(claim, commit=winner), just_committed=True)
            fault_points.reached("ingest.published")
        log.info(
            "partition %d [%d, %d): %d rows, claim %d (%s)",
            claim.partition,
            claim.start,
            claim.end,
            winner.rows,
            claim.seq,
            "written" if winner == commit else f"committed by run {winner.run}",
        )
    return found, state


def settle(job: Job, ledger: Ledger, wanted: OffsetRange, state: LedgerState | None = None) -> Outcome:
    """Compact the partition's ledger and say what the lake holds of ``wanted``: its pieces, problems, gaps
    (from ``state``, the ledger as this run's commits left it, or read now)."""
    state = state or ledger.read()
    for claim in state.recent:
        if claim.committed and claim.overlaps(wanted.start, wanted.end):
            ledger.publish(claim)  # another run may have committed without publishing yet
    state = ledger.compact(state)
    final = ledger.full_plan(state, wanted)
    gaps = [f"partition {wanted.partition}: the lake misses offsets [{s}, {e})" for s, e in final.gaps]
    entries = [entry_of(job, claim) for claim in final.held]
    found = problems(entries, job.compacted, job.head_loss_ok)
    if not final.settled and not found:
        open_pieces = [(c.seq, c.start, c.end) for c in final.write] + [(None, r.start, r.end) for r in final.claim]
        found.append(f"partition {wanted.partition}: pieces (claim, start, end) {open_pieces} are not committed")
    return Outcome(entries, found, gaps, "")


def ingest_parquet(spark: SparkSession, job: Job, document: RangesDocument) -> Outcome:
    """Claim, read in one Spark job, stage, commit, publish and compact every open piece of ``document``'s
    ranges."""
    job.store.check_create_exclusive()
    ranges = [r for r in document.ranges if r.count > 0]
    size = piece_size(sum(r.count for r in ranges), job.tasks, job.max_records)
    ledgers = {r.partition: job.ledger(r.partition) for r in ranges}
    began = time.perf_counter()
    claimed = each(job, lambda r: claim_range(job, ledgers[r.partition], r, size), ranges)
    open_claims = [claim for claims, _ in claimed for claim in claims]
    states: dict[int, LedgerState | None] = {}
    log.info("%d partition(s): %d open piece(s) in %.2f s", len(ranges), len(open_claims), time.perf_counter() - began)
    fault_points.reached("ingest.claimed")
    found: list[str] = []
    if open_claims:
        began = time.perf_counter()
        staged = stage_all(spark, job, open_claims)
        log.info("%d piece(s) read, staged and counted in %.2f s", len(staged), time.perf_counter() - began)
        fault_points.reached("ingest.staged")
        began = time.perf_counter()
        by_partition: dict[int, dict[Claim, tuple[str, int, PieceStats]]] = {}
        for claim, piece in staged.items():
            by_partition.setdefault(claim.partition, {})[claim] = piece
        known = {r.partition: state for r, (_, state) in zip(ranges, claimed, strict=True)}
        partitions = list(by_partition)
        commits = each(job, lambda p: commit_partition(job, ledgers[p], by_partition[p], known[p]), partitions)
        for partition, (problems_found, state) in zip(partitions, commits, strict=True):
            found += problems_found
            states[partition] = state
        job.store.delete(f"{job.stream_folder}/{job.staging_root}")  # what is left: Spark's marker files
        log.info("%d piece(s) committed and published in %.2f s", len(staged), time.perf_counter() - began)
    began = time.perf_counter()
    total = Outcome([], found, [], "")
    for outcome in each(job, lambda r: settle(job, ledgers[r.partition], r, states.get(r.partition)), ranges):
        total.entries += outcome.entries
        total.problems += outcome.problems
        total.gaps += outcome.gaps
    log.info("%d partition(s) compacted and settled in %.2f s", len(ranges), time.perf_counter() - began)
    return total


def write_manifest(store: HadoopStore, stream_folder: str, document: RangesDocument, outcome: Outcome, run: str) -> str:
    """Write ``_manifests/<hash of the ranges>.json`` beside the data, through the output's filesystem."""
    digest = hashlib.sha256(document.dumps().encode()).hexdigest()[:16]
    path = f"{stream_folder}/_manifests/{digest}.json"
    manifest = {
        "ranges": document.to_json(),
        "written": outcome.entries,
        "total_rows": sum(e["rows"] for e in outcome.entries),
        "gaps": outcome.gaps,
        "run": run,
    }
    store.write(path, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    return path
