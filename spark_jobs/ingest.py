"""Ingest frozen Liftbridge offset ranges into Parquet, each range exactly once.

    spark-submit spark_jobs/ingest.py --brokers HOST:PORT --ranges '<json>' --output DIR
        [--stream NAME] [--min-partitions N] [--max-records-per-partition N]
        [--read-from-replica] [--allow-gaps] [--tls-ca-cert PATH ...]

``--ranges`` is the document LiftbridgeOffsetRangesOperator returns, inline
JSON or ``@path/to/file.json``. Every non-empty range is written to its own
folder, overwritten on each run, so a rerun replaces and never duplicates::

    DIR/stream=<stream>/partition=<p>/range=<start>-<end>/part-*.parquet

Then ``DIR/stream=<stream>/_manifests/<first>-<last>.json`` records the rows
per range. The job exits non-zero when a range yields fewer rows than it spans
(unless ``--allow-gaps``, for compacted streams) or holds an offset outside it.
It never moves a cursor: committing is the next task's job.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from liftbridge_provider.ranges import OffsetRange, RangesDocument

log = logging.getLogger("liftbridge.ingest")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", required=True, help="host:port[,host:port]")
    parser.add_argument("--ranges", required=True, help="ranges document: JSON, or @file")
    parser.add_argument("--output", required=True, help="output root folder")
    parser.add_argument("--stream", help="expected stream name (checked against the document)")
    parser.add_argument("--min-partitions", type=int)
    parser.add_argument("--max-records-per-partition", type=int)
    parser.add_argument("--read-from-replica", action="store_true")
    parser.add_argument("--allow-gaps", action="store_true", help="accept missing offsets (compacted streams)")
    parser.add_argument("--tls-ca-cert")
    parser.add_argument("--tls-client-cert")
    parser.add_argument("--tls-private-key")
    parser.add_argument("--tls-server-name")
    parser.add_argument("--request-timeout", type=float)
    return parser.parse_args(argv)


def load_ranges(value: str) -> RangesDocument:
    text = Path(value[1:]).read_text() if value.startswith("@") else value
    return RangesDocument.parse(text)


def range_folder(output: str, stream: str, offset_range: OffsetRange) -> str:
    partition, start, end = offset_range.partition, offset_range.start, offset_range.end
    return f"{output.rstrip('/')}/stream={stream}/partition={partition}/range={start}-{end}"


def source_options(args: argparse.Namespace, document: RangesDocument) -> dict[str, str]:
    options = {"brokers": args.brokers, "ranges": document.dumps()}
    optional = {
        "minPartitions": args.min_partitions,
        "maxRecordsPerPartition": args.max_records_per_partition,
        "tlsCaCert": args.tls_ca_cert,
        "tlsClientCert": args.tls_client_cert,
        "tlsPrivateKey": args.tls_private_key,
        "tlsServerName": args.tls_server_name,
        "requestTimeout": args.request_timeout,
    }
    options.update({k: str(v) for k, v in optional.items() if v is not None})
    if args.read_from_replica:
        options["readFromReplica"] = "true"
    if args.allow_gaps:
        options["failOnDataLoss"] = "false"  # compaction can remove a range's first offsets too
    return options


def ingest_range(
    spark: SparkSession, args: argparse.Namespace, document: RangesDocument, offset_range: OffsetRange
) -> dict[str, Any]:
    """Read one range and overwrite its folder; returns its manifest entry."""
    single = RangesDocument(document.stream, (offset_range,), document.cursor_id)
    frame = spark.read.format("liftbridge").options(**source_options(args, single)).load()
    folder = range_folder(args.output, document.stream, offset_range)
    frame.write.mode("overwrite").parquet(folder)
    stats = (
        spark.read.parquet(folder)
        .agg(F.count("*").alias("rows"), F.min("offset").alias("min"), F.max("offset").alias("max"))
        .first()
    )
    assert stats is not None
    entry = {
        **offset_range.to_json(),
        "rows": stats["rows"],
        "min_offset": stats["min"],
        "max_offset": stats["max"],
        "path": folder,
    }
    log.info(
        "partition %d [%d, %d): %d rows -> %s",
        offset_range.partition,
        offset_range.start,
        offset_range.end,
        stats["rows"],
        folder,
    )
    return entry


def problems(entries: list[dict[str, Any]], allow_gaps: bool) -> list[str]:
    """What is wrong with the rows written: shortfalls, or offsets outside their range."""
    found = []
    for e in entries:
        spanned = e["end"] - e["start"]
        if e["rows"] and (e["min_offset"] < e["start"] or e["max_offset"] >= e["end"]):
            outside = f"offsets {e['min_offset']}-{e['max_offset']} outside [{e['start']}, {e['end']})"
            found.append(f"partition {e['partition']}: {outside}")
        if e["rows"] > spanned or (e["rows"] < spanned and not allow_gaps):
            found.append(
                f"partition {e['partition']}: {e['rows']} rows for {spanned} offsets [{e['start']}, {e['end']})"
            )
    return found


def write_manifest(output: str, document: RangesDocument, entries: list[dict[str, Any]]) -> str:
    digest = hashlib.sha256(document.dumps().encode()).hexdigest()[:16]
    folder = Path(output) / f"stream={document.stream}" / "_manifests"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{digest}.json"
    path.write_text(
        json.dumps(
            {"ranges": document.to_json(), "written": entries, "total_rows": sum(e["rows"] for e in entries)},
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    return str(path)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    document = load_ranges(args.ranges)
    if args.stream and args.stream != document.stream:
        log.error("--stream %s differs from the ranges document's stream %s", args.stream, document.stream)
        return 2
    spark = SparkSession.builder.appName(f"liftbridge-ingest-{document.stream}").getOrCreate()
    try:
        entries = [ingest_range(spark, args, document, r) for r in document.ranges if r.count > 0]
    finally:
        spark.stop()
    manifest = write_manifest(args.output, document, entries)
    found = problems(entries, args.allow_gaps)
    for problem in found:
        log.error("%s", problem)
    log.info("ingested %d rows in %d range(s); manifest %s", sum(e["rows"] for e in entries), len(entries), manifest)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
