"""Ingest frozen Liftbridge offset ranges into Parquet, every offset exactly once in the lake.

    spark-submit "$(python -m liftbridge_provider.spark.ingest --path)" --ranges '<json>' --output DIR
        [--liftbridge-conn-json '<json>' | --brokers HOST:PORT[,...]] [--stream NAME]
        [--format parquet|delta] [--compacted] [--on-data-loss fail|skip] [--min-partitions N]
        [--max-records-per-partition N] [--read-timeout S] [--batch-size N] [--batch-bytes N]
        [--read-from-replica] [--tls-ca-cert PATH ...]

The connection is the JSON form of the Airflow ``liftbridge`` connection
(``--liftbridge-conn-json``, else the ``LIFTBRIDGE_CONN_JSON`` environment
variable): brokers, default port and TLS as the hook reads them; the flags
``--brokers``, ``--tls-*``, ``--request-timeout`` and ``--read-from-replica``
override its fields. ``--ranges`` is the document LiftbridgeOffsetRangesOperator
returns, inline JSON or ``@path/to/file.json``. DIR may be any URI Spark
writes (``file:``, ``hdfs:``, ``s3a:``...), or a plain path.

Writes are fenced by a claim ledger (liftbridge_provider/core/lake.py): each range
is trimmed to the offsets no earlier or concurrent run claimed, so overlapping
ranges never write an offset twice, and a rerun completes what a crashed run
claimed. Rows land in ``DIR/stream=<s>/partition=<p>/range=<start>-<end>/``;
``DIR/stream=<s>/_manifests/<hash of the ranges>.json`` lists the pieces that
hold each range. With ``--format delta``, DIR is a Delta table (a local path or
``s3a://``): the offsets it holds are kept in the table's own log and committed
with the rows in one transaction (liftbridge_provider/spark/delta_ingest.py).
On S3, an Airflow ``aws`` connection in ``LIFTBRIDGE_AWS_CONN_JSON``, else
Spark's S3A settings and the environment, give S3A, delta-rs and pyiceberg the
same endpoint and keys (liftbridge_provider/spark/s3_session.py).

The job exits 1 when a piece holds fewer rows than offsets (unless
``--compacted``; with ``--on-data-loss skip`` a missing head is accepted) or
an offset outside it; such a piece is not committed. It never
moves a cursor: committing is the next task's job.

A rerun that finds every range in the lake already says so and exits 0 before it
starts Spark (liftbridge_provider/spark/landed.py). Before reading, the job
checks that the executors' Python can import this package (a cluster whose
workers run another interpreter fails with Spark's "Failed to find the data
source: liftbridge", which hides that) and says how to ship it (``make dist``, ``--archives``; docs/spark.md).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import shutil
import sys
import uuid
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from pyspark.sql import SparkSession

from liftbridge_provider.client import ClientConfig, InvalidArgumentError, LiftbridgeClient, TLSConfig
from liftbridge_provider.connection import config_from_connection_json
from liftbridge_provider.core.lake import LakeError, Outcome
from liftbridge_provider.core.ranges import RangesDocument
from liftbridge_provider.core.s3_sources import s3_location
from liftbridge_provider.spark.lake_store import CountingStore, HadoopStore, LakeStore
from liftbridge_provider.spark.landed import landed_before_spark
from liftbridge_provider.spark.object_store import check_output_filesystem
from liftbridge_provider.spark.options import OptionError, parse_options
from liftbridge_provider.spark.parquet_ingest import Job, ingest_parquet, write_manifest
from liftbridge_provider.spark.reader import check_end_committed, each_range
from liftbridge_provider.spark.s3_session import session_s3_settings, use_aws_connection
from liftbridge_provider.spark.source import LiftbridgeDataSource
from liftbridge_provider.spark.table_formats import delta_format, iceberg_format
from liftbridge_provider.spark.table_ingest import ingest_table

log = logging.getLogger("liftbridge.ingest")

CONNECTION_ENV = "LIFTBRIDGE_CONN_JSON"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--liftbridge-conn-json", help=f"the liftbridge connection as JSON (default: ${CONNECTION_ENV})"
    )
    parser.add_argument("--brokers", help="host:port[,host:port] (overrides the connection's host and port)")
    parser.add_argument("--ranges", required=True, help="ranges document: JSON, or @file")
    parser.add_argument("--output", required=True, help="output folder or URI (delta: the table; iceberg: warehouse)")
    parser.add_argument(
        "--format",
        dest="lake_format",
        choices=("parquet", "delta", "iceberg"),
        default="parquet",
        help="parquet: range folders fenced by a claim ledger (default); delta: a Delta table (a local path or "
        "s3a://) whose log records the offsets it holds; iceberg: an Iceberg table whose properties record them",
    )
    parser.add_argument(
        "--iceberg-catalog",
        default="liftbridge",
        help="pyiceberg catalog name (its settings may also come from ~/.pyiceberg.yaml or PYICEBERG_CATALOG__*)",
    )
    parser.add_argument(
        "--iceberg-catalog-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a catalog property as pyiceberg names it (type, uri, warehouse, ...); repeat for more. None: an "
        "embedded SQL catalog on SQLite in a local --output (an s3a:// --output needs a catalog)",
    )
    parser.add_argument("--iceberg-table", help="namespace.table (default liftbridge.<stream>)")
    parser.add_argument("--stream", help="expected stream name (checked against the document)")
    parser.add_argument("--min-partitions", type=int)
    parser.add_argument("--max-records-per-partition", type=int)
    parser.add_argument("--read-from-replica", action="store_true")
    parser.add_argument(
        "--compacted",
        "--allow-gaps",
        dest="compacted",
        action="store_true",
        help="the stream is compacted: missing offsets are normal, nothing is reported lost",
    )
    parser.add_argument(
        "--on-data-loss",
        choices=("fail", "skip"),
        default="fail",
        help="when retention removed a range's first offsets: fail (default) or start at the oldest one",
    )
    parser.add_argument("--tls-ca-cert")
    parser.add_argument("--tls-client-cert")
    parser.add_argument("--tls-private-key")
    parser.add_argument("--tls-server-name")
    parser.add_argument("--request-timeout", type=float, help="seconds per request (default 10)")
    parser.add_argument("--read-timeout", type=float, help="seconds a read may go without a new message (default 120)")
    parser.add_argument("--batch-size", type=int, help="rows per Arrow batch (default 10000)")
    parser.add_argument("--batch-bytes", type=int, help="key+value+header bytes per Arrow batch (default 64 MiB)")
    return parser.parse_args(argv)


def load_ranges(value: str, stream: str | None = None) -> RangesDocument:
    """The ranges document of ``--ranges``; InvalidArgumentError when ``--stream`` names another stream."""
    text = Path(value[1:]).read_text() if value.startswith("@") else value
    document = RangesDocument.parse(text)
    if stream and stream != document.stream:
        raise InvalidArgumentError(f"--stream {stream} differs from the ranges document's {document.stream}")
    return document


def client_config(args: argparse.Namespace, environ: Mapping[str, str]) -> ClientConfig:
    """The connection (argument, else environment) with the command line's overrides."""
    text = args.liftbridge_conn_json or environ.get(CONNECTION_ENV)
    if not text and not args.brokers:
        raise InvalidArgumentError(f"give the connection (--liftbridge-conn-json or ${CONNECTION_ENV}) or --brokers")
    config = config_from_connection_json(text) if text else ClientConfig.of(args.brokers)
    overrides: dict[str, Any] = {}
    if args.brokers:
        overrides["brokers"] = args.brokers
    tls_flags = (args.tls_ca_cert, args.tls_client_cert, args.tls_private_key, args.tls_server_name)
    if any(tls_flags):
        overrides["tls"] = TLSConfig(ca=tls_flags[0], cert=tls_flags[1], key=tls_flags[2], server_name=tls_flags[3])
    if args.request_timeout is not None:
        overrides["request_timeout"] = args.request_timeout
    if args.read_from_replica:
        overrides["read_isr_replica"] = True
    return dataclasses.replace(config, **overrides) if overrides else config


def _text(value: str | bytes | Path | None) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def source_options(config: ClientConfig, args: argparse.Namespace, *, cores: int | None = None) -> dict[str, str]:
    """The ``liftbridge`` source's options for this job (every range the same; ``ranges`` added per piece).

    ``minPartitions`` is ``--min-partitions``, else ``cores`` (the cluster's, ``defaultParallelism``), so
    that every core reads even when a run has fewer pieces than cores.
    """
    tls = config.tls
    optional = {
        "tlsCaCert": _text(tls.ca) if tls else None,
        "tlsClientCert": _text(tls.cert) if tls else None,
        "tlsPrivateKey": _text(tls.key) if tls else None,
        "tlsServerName": tls.server_name if tls else None,
        "minPartitions": args.min_partitions if args.min_partitions is not None else cores,
        "maxRecordsPerPartition": args.max_records_per_partition,
        "readTimeout": args.read_timeout,
        "batchSize": args.batch_size,
        "batchBytes": args.batch_bytes,
    }
    options = {
        "brokers": ",".join(config.brokers),
        "requestTimeout": str(config.request_timeout),
        "readFromReplica": str(config.read_isr_replica).lower(),
        "compacted": str(args.compacted).lower(),
        "failOnDataLoss": str(args.on_data_loss == "fail").lower(),
    }
    options.update({k: str(v) for k, v in optional.items() if v is not None})
    return options


def run(
    spark: SparkSession,
    args: argparse.Namespace,
    *,
    store: LakeStore | None = None,
    environ: Mapping[str, str] | None = None,
) -> Outcome:
    """Ingest every non-empty range of ``args.ranges`` with ``spark``; raises InvalidArgumentError, LakeError."""
    environ = os.environ if environ is None else environ
    use_aws_connection(spark, environ)  # an aws connection becomes the session's S3A settings (s3_session.py)
    check_output_filesystem(spark, args.output)  # MissingFileSystemError, naming the jars, before any claim
    document = load_ranges(args.ranges, args.stream)
    config = client_config(args, environ)
    check_ends_committed(config, document)
    if args.lake_format in ("delta", "iceberg"):
        settings = session_s3_settings(spark, args.output, environ)  # S3A's, for delta-rs and pyiceberg too
        if args.lake_format == "delta":
            table = delta_format(args, settings)
        else:
            table = iceberg_format(args, document.stream, settings)
        table.check()  # an unusable table is refused before anything is written
        total = ingest_table(
            spark,
            document,
            source_options(config, args, cores=spark.sparkContext.defaultParallelism),
            table,
            run=uuid.uuid4().hex[:12],
            compacted=args.compacted,
            head_loss_ok=args.on_data_loss == "skip",
        )
    else:
        total = _ingest_parquet(spark, args, document, config, store)
    log_gaps(total)
    return total


def log_gaps(outcome: Outcome) -> None:
    for gap in outcome.gaps:
        log.warning("%s (in no run's range: check the cursor history; a rerun passes once they land)", gap)


def check_ends_committed(config: ClientConfig, document: RangesDocument) -> None:
    """Refuse a range whose end is beyond its partition's committed high watermark before anything is claimed
    or written (BeyondHighWatermarkError): a Parquet claim left open by a run whose read then failed must be
    written whole by every later run that overlaps it, so a mistyped end would hold the partition back."""
    ranges = [r for r in document.ranges if r.count]
    with LiftbridgeClient(config) as client:  # a request per partition, to its leader, a few at once
        each_range(lambda r: check_end_committed(client, document.stream, r), ranges)


def _ingest_parquet(
    spark: SparkSession,
    args: argparse.Namespace,
    document: RangesDocument,
    config: ClientConfig,
    store: LakeStore | None,
) -> Outcome:
    counted = CountingStore(store or HadoopStore(spark, args.output))
    cores = spark.sparkContext.defaultParallelism
    job = Job(
        store=counted,
        stream=document.stream,
        stream_folder=f"{counted.root}/stream={document.stream}",
        run=uuid.uuid4().hex[:12],
        options=source_options(config, args, cores=cores),
        compacted=args.compacted,
        head_loss_ok=args.on_data_loss == "skip",
        tasks=args.min_partitions or cores,
        max_records=args.max_records_per_partition,
    )
    total = ingest_parquet(spark, job, document)
    total.manifest = write_manifest(counted.store, job.stream_folder, document, total, job.run)
    log.info("the ledger's requests this run: %d %s", counted.total, dict(sorted(counted.counts.items())))
    return total


def exit_status(outcome: Outcome, on_data_loss: str) -> int:
    """The job's exit status for what it did: 1 when a piece failed its checks, or when the lake misses
    offsets no run's range covered (unless ``--on-data-loss skip``); else 0."""
    return 1 if outcome.problems or (outcome.gaps and on_data_loss != "skip") else 0


def job_path() -> str:
    """The file to give spark-submit for this job (the installed module itself)."""
    return str(Path(__file__).resolve())


def missing_driver_python(python: str | None, deploy_mode: str, usable: Callable[[str], bool]) -> str | None:
    """Why the driver cannot start the Python workers that plan a data source read, or None (pure).

    In client mode Spark starts them on the driver with ``spark.pyspark.python``, relative to where
    spark-submit runs: an archive shipped with ``--archives ...#env`` is unpacked on the executors only, so
    ``./env/bin/python`` must exist there too. ``usable(path)`` says whether an interpreter can be run.
    """
    if python is None or deploy_mode != "client" or usable(python):
        return None
    return (
        f"spark.pyspark.python={python!r} cannot be run where spark-submit runs ({os.getcwd()}): in client mode "
        "Spark plans the liftbridge read in a Python worker on the driver with that interpreter; unpack the "
        "archive here too (mkdir -p env && tar -xzf dist/liftbridge-spark-env.tar.gz -C env) or set "
        "spark.pyspark.driver.python and run from a folder that holds it (docs/spark.md, 'On a cluster')"
    )


def _runnable(python: str) -> bool:
    found = shutil.which(python) if os.sep not in python else python
    return found is not None and os.access(found, os.X_OK)


def check_executors(spark: SparkSession) -> None:
    """Fail with a clear message, before anything is claimed, when the driver cannot start the Python that
    plans the read or the executors' Python lacks this package (and register the source)."""
    problem = missing_driver_python(
        spark.conf.get("spark.pyspark.python", None), spark.conf.get("spark.submit.deployMode") or "client", _runnable
    )
    if problem is not None:
        raise LakeError(problem)

    def importable(_: object) -> bool:  # runs in the executor's Python: defined here, so shipped by value
        import importlib.util  # noqa: PLC0415

        return all(importlib.util.find_spec(name) is not None for name in ("liftbridge_provider", "grpc", "pyarrow"))

    if not _source_found(spark):
        spark.dataSource.register(LiftbridgeDataSource)
    python = spark.conf.get("spark.pyspark.python", None) or os.environ.get("PYSPARK_PYTHON") or "python3"
    try:
        found = spark.sparkContext.parallelize([0], 1).map(importable).collect()
    except Exception as exc:  # the probe itself failed in the worker (e.g. no such interpreter)
        raise LakeError(f"the executors could not run the Python probe with {python!r}: {exc}") from exc
    if not all(found):
        raise LakeError(
            f"the executors' Python ({python!r}) cannot import liftbridge_provider, grpc or pyarrow, so Spark "
            "would report 'Failed to find the data source: liftbridge': ship the packed environment "
            "(make dist; spark-submit --archives dist/liftbridge-spark-env.tar.gz#env --conf "
            "spark.pyspark.python=./env/bin/python), or install the package on every worker (docs/spark.md)"
        )


def _source_found(spark: SparkSession) -> bool:
    """Whether Spark found the source by itself (PySpark registers ``pyspark_liftbridge.DefaultSource``):
    registered again, Spark warned on every run that it 'replaced a statically registered data source'."""
    try:
        return bool(spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists("liftbridge"))
    except Exception:  # no such JVM call (another Spark): register it, as before
        return False


SOURCE_FLAGS = {
    "minPartitions": "--min-partitions",
    "maxRecordsPerPartition": "--max-records-per-partition",
    "readTimeout": "--read-timeout",
    "batchSize": "--batch-size",
    "batchBytes": "--batch-bytes",
    "requestTimeout": "--request-timeout",
}


def check_source_arguments(args: argparse.Namespace, config: ClientConfig) -> None:
    """The source options the job's arguments make, checked as the source will check them, with the
    flag named: a --batch-size of 0 failed the first read, after the run had claimed its pieces."""
    try:
        parse_options({**source_options(config, args, cores=1), "ranges": "{}"})
    except OptionError as exc:
        flag = SOURCE_FLAGS.get(exc.option)
        if flag is None:
            raise
        raise InvalidArgumentError(f"{flag} (option {exc.option}) {exc.problem}") from None


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:] == ["--path"]:
        print(job_path())
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its per-connection INFO lines say nothing to users
    # PySpark 4.3 imports its test helpers (pyspark.testing.utils) when py4j converts an argument, and they warn
    # when pandas >= 3 is installed; the job uses no pandas (docs/spark.md, "What a run prints").
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    args = parse_args(argv)
    try:  # refuse bad input before starting Spark (and so before anything is claimed in the lake)
        document = load_ranges(args.ranges, args.stream)
        check_source_arguments(args, client_config(args, os.environ))
        if args.lake_format in ("delta", "iceberg"):  # on S3, the table is checked once Spark has its settings
            table = delta_format(args, None) if args.lake_format == "delta" else iceberg_format(args, document.stream)
            if s3_location(args.output) is None:
                table.check()
    except InvalidArgumentError as exc:
        log.error("%s", exc)
        return 2
    except Exception as exc:  # e.g. a DeltaError reading the table's log
        log.error("cannot start the ingest: %s: %s", type(exc).__name__, exc)
        return 1
    landed = landed_before_spark(args, document, os.environ)  # nothing to do: no Spark at all (spark/landed.py)
    if landed is not None:
        log_gaps(landed)
        return report(landed, args)
    spark = SparkSession.builder.appName("liftbridge-ingest").getOrCreate()
    try:
        return run_reported(spark, args)
    finally:
        _stop(spark)


def run_reported(spark: SparkSession, args: argparse.Namespace) -> int:
    """:func:`run` on ``spark`` as the job runs it after its input checks: the executors checked first, what
    happened logged, and the job's exit status returned (0 done; 1 a failed run, a piece that failed its checks
    or, unless ``--on-data-loss skip``, a lake that misses offsets; 2 bad input). ``spark`` is left running."""
    try:
        check_executors(spark)
        outcome = run(spark, args)
    except (InvalidArgumentError, LakeError) as exc:
        log.error("%s", exc)
        return 2 if isinstance(exc, InvalidArgumentError) else 1
    except Exception as exc:  # a failed Spark job, a Liftbridge or Delta error: a failed run, with its cause
        log.error("the ingest failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
        return 1
    return report(outcome, args)


def report(outcome: Outcome, args: argparse.Namespace) -> int:
    """Log what a run found (its problems, its summary line) and return the job's exit status for it."""
    for problem in outcome.problems:
        log.error("%s", problem)
    rows = sum(e["rows"] for e in outcome.entries)
    log.info(
        "the lake holds %d rows in %d piece(s) for these ranges; manifest %s",
        rows,
        len(outcome.entries),
        outcome.manifest,
    )
    status = exit_status(outcome, args.on_data_loss)
    if outcome.gaps and status:
        log.error(
            "the lake misses offsets that no range covered (%s): failing; --on-data-loss skip accepts that",
            "; ".join(outcome.gaps),
        )
    return status


def _stop(spark: SparkSession) -> None:
    try:
        spark.stop()
    except Exception as exc:  # the run's status stands; the driver ends anyway
        log.warning("stopping Spark: %s: %s", type(exc).__name__, exc)


def run_job(argv: list[str] | None = None) -> NoReturn:
    """The job's entry point for spark-submit: :func:`main`, then :func:`exit_now` on every path.

    An exception that escapes ``main`` (or argparse's exit) still ends the
    driver through ``exit_now``, never through interpreter shutdown.
    """
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse: --help (0) or bad arguments (2)
        status = exc.code if isinstance(exc.code, int) else 2
    except BaseException as exc:
        log.critical("the ingest job failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
        status = 1
    exit_now(status)


def exit_now(status: int) -> NoReturn:
    """End the driver process with ``status``, its output flushed, without Python's interpreter shutdown.

    Shutdown stops py4j's daemon threads wherever they are; one stopped in the
    middle of a log call keeps the log handler's lock, and the gateway's cleanup
    (``ClientServerConnection.__del__``, which logs) or logging's own exit hook
    then waits for that lock forever: the job did its work, but spark-submit and
    the Airflow task never end (seen in CI). Everything the job writes is
    written and closed before ``main`` returns, and Spark is stopped.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe: nothing more can be said
            stream.flush()
    os._exit(status)


if __name__ == "__main__":
    run_job()
