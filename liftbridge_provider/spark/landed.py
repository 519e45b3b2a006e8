"""A rerun with nothing to do, found on the driver before Spark starts (issue 50, item 5).

The ingest job asks, before it creates a SparkSession, whether the lake holds every range of its ranges
document already, each format through its own record of what it holds:

- Parquet: the claim ledger of each range's partition, read as a run reads it (``core/lake_ledger.py``), and
  the decision of ``core/lake_landed.py`` (settled, and every piece above the checkpoint published);
- Delta: the table's application transactions (delta-rs), Iceberg: its table properties (pyiceberg), and
  ``table_plan.plan_table(...).done``.

When the lake holds them all, the job reports what the usual run would (the Parquet manifest is written again,
the summary line is the same) and ends with status 0: no SparkContext, so no application on a cluster, no
executors and no archive unpacked on the workers. Anything else (a range partly held, a claim not committed, a
piece not published, a problem the usual run would report, an error reading the lake) starts Spark and runs as
before, recovery included.

Without a SparkContext, the lake's filesystem is reached through the driver's JVM (the one spark-submit started,
or one started here as a SparkContext would) with the Hadoop configuration Spark would give the session
(``SparkHadoopUtil.newConfiguration`` of ``spark.*`` settings: ``spark.hadoop.*``, AWS keys from the
environment), and an ``aws`` connection's keys added as ``s3_session.py`` adds them.
"""

from __future__ import annotations

import argparse
import logging
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from liftbridge_provider.core.lake import Outcome, problems
from liftbridge_provider.core.lake_landed import pieces_to_look_at, range_landed
from liftbridge_provider.core.lake_ledger import Ledger
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.spark.lake_store import HadoopStore
from liftbridge_provider.spark.object_store import java_reason
from liftbridge_provider.spark.parquet_ingest import DRIVER_THREADS, piece_entry, write_manifest
from liftbridge_provider.spark.s3_session import apply_aws_connection, conf_s3_settings
from liftbridge_provider.spark.table_formats import delta_format, iceberg_format
from liftbridge_provider.spark.table_ingest import held_outcome

log = logging.getLogger("liftbridge.ingest")


def driver_hadoop(environ: Mapping[str, str]) -> tuple[Any, Any]:
    """The driver's JVM and the Hadoop configuration a SparkContext would have, without creating one (the
    running context's own when a session exists, as in tests), with ``environ``'s aws connection applied."""
    from pyspark import SparkContext  # noqa: PLC0415 - the gateway only: no context is created

    active = SparkContext._active_spark_context
    if active is not None:
        jvm, conf = SparkContext._jvm, active._jsc.hadoopConfiguration()
    else:
        SparkContext._ensure_initialized()  # spark-submit's JVM, or a new one as a SparkContext would start it
        jvm = SparkContext._jvm
        assert jvm is not None
        conf = jvm.org.apache.spark.deploy.SparkHadoopUtil.get().newConfiguration(jvm.org.apache.spark.SparkConf(True))
    apply_aws_connection(conf, environ)
    return jvm, conf


def already_landed(args: argparse.Namespace, document: RangesDocument, environ: Mapping[str, str]) -> Outcome | None:
    """The outcome of a run of ``args`` that finds every range of ``document`` in the lake, with its manifest
    written (Parquet); None when a range is not held whole. Raises what reading the lake raises."""
    hadoop = driver_hadoop(environ)
    if args.lake_format == "parquet":
        return _parquet_landed(args, document, hadoop)
    settings = conf_s3_settings(hadoop[1], args.output, environ)
    if args.lake_format == "delta":
        table = delta_format(args, settings)
    else:
        table = iceberg_format(args, document.stream, settings)
    if not table.load():
        return None
    return held_outcome(table, document)


def _parquet_landed(args: argparse.Namespace, document: RangesDocument, hadoop: tuple[Any, Any]) -> Outcome | None:
    store = HadoopStore(None, args.output, hadoop=hadoop)
    store.check_create_exclusive()  # a store the usual run refuses is refused by it, not passed here
    folder = f"{store.root}/stream={document.stream}"
    run = uuid.uuid4().hex[:12]

    def landed(wanted: OffsetRange) -> Outcome | None:
        ledger = Ledger(store, folder, wanted.partition, run)
        state = ledger.read()
        plan = ledger.full_plan(state, wanted)
        if not plan.settled:
            return None
        sizes = {c.seq: store.object_size(f"{folder}/{c.published_path}") for c in pieces_to_look_at(plan, state.upto)}
        if not range_landed(plan, state.upto, sizes):
            return None
        entries = [piece_entry(folder, claim) for claim in plan.held]
        if problems(entries, args.compacted, args.on_data_loss == "skip"):
            return None  # the usual run reports them
        gaps = [f"partition {wanted.partition}: the lake misses offsets [{s}, {e})" for s, e in plan.gaps]
        return Outcome(entries, [], gaps, "")

    ranges = [r for r in document.ranges if r.count > 0]
    with ThreadPoolExecutor(max(1, min(DRIVER_THREADS, len(ranges))), thread_name_prefix="landed") as pool:
        outcomes = list(pool.map(landed, ranges))
    total = Outcome([], [], [], "")
    for outcome in outcomes:
        if outcome is None:
            return None
        total.entries += outcome.entries
        total.gaps += outcome.gaps
    total.manifest = write_manifest(store, folder, document, total, run)
    return total


def landed_before_spark(
    args: argparse.Namespace, document: RangesDocument, environ: Mapping[str, str]
) -> Outcome | None:
    """:func:`already_landed`, logged; None (start Spark and run as usual) when it cannot tell."""
    began = time.perf_counter()
    try:
        outcome = already_landed(args, document, environ)
    except Exception as exc:  # the usual run reads the lake again and reports what is wrong
        # one line, the innermost Java reason for a JVM failure (a missing S3A jar): the usual run's own check
        # then names what to add, and py4j's wrapper and trace stay out of the log
        reason = java_reason(exc).splitlines()[0]
        log.info("could not tell before starting Spark whether the lake holds the ranges (%s)", reason)
        return None
    if outcome is None:
        log.info("the lake lacks part of the ranges (%.2f s to tell): starting Spark", time.perf_counter() - began)
        return None
    log.info(
        "every range is in the lake already (%.2f s to tell, on the driver): nothing to read, Spark not started",
        time.perf_counter() - began,
    )
    return outcome
