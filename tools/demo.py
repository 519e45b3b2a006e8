"""The main job (`make demo`): the example ingestion DAG end to end, on embedded defaults.

Starts a Liftbridge node on 127.0.0.1, prepares an Airflow home with a SQLite
metadata DB in ``.airflow/`` (the project's ``dags/`` as DAG folder, the
connections from the environment), then runs ``airflow dags test
liftbridge_spark_ingest`` three times: two batches of events, then a run with
nothing new. It prints the rows ingested per run, the output path and the
cursor positions, checks that the lake's rows equal the messages published
(each offset once), and stops the node. Exits non-zero on any mismatch.

``--format parquet|delta|iceberg`` (``make demo FORMAT=...``, default parquet)
picks the lake: range folders with a claim ledger, a Delta table, or an
Iceberg table in an embedded SQLite catalog, all under ``out/``.

``--lake s3`` (``make demo LAKE=s3``, default ``local``) writes the same lake to
an S3-compatible server instead: Versity's S3 gateway started on 127.0.0.1
(``liftbridge_provider.devserver.s3``) with its files in ``out/s3-lake[-FORMAT]/``
and a bucket ``demo``; the lake is ``s3a://demo/lake[-FORMAT]``. Airflow gets the
gateway's endpoint and keys the way users give them, as the Amazon provider's
``aws`` connection ``aws_default`` (in the environment, ``AIRFLOW_CONN_AWS_DEFAULT``;
the DAG's ``aws_conn_id`` parameter names it), and Spark gets S3A's jars from a
``spark-defaults.conf`` (``spark.jars``) in a ``SPARK_CONF_DIR`` of the demo's
own. Iceberg on S3 needs a catalog named: a pyiceberg SQL catalog on a local file
(``PYICEBERG_CATALOG__LIFTBRIDGE__*``), the warehouse in the bucket. The rows are
read back from the bucket with the same keys (pyarrow, delta-rs, pyiceberg).

Every ``airflow`` command runs in a session of its own, marked in its
environment; whatever it left running (a task's ``spark-submit``, its JVM) is
killed when it ends, also when the demo fails or is interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pyarrow.parquet as pq

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.core.object_store import S3Settings
from liftbridge_provider.devserver import start_single
from liftbridge_provider.devserver.leftovers import end_session

ROOT = Path(__file__).resolve().parents[1]
# Overridable so the system test can run the demo in a temporary folder.
AIRFLOW_HOME = Path(os.environ.get("DEMO_AIRFLOW_HOME", ROOT / ".airflow"))
OUTPUT = Path(os.environ.get("DEMO_OUTPUT", ROOT / "out" / "lake"))
FORMATS = ("parquet", "delta", "iceberg")
LAKES = ("local", "s3")
STREAM = "demo-events"
BATCHES = [1000, 500, 0]  # events published by each run; the last run finds nothing new
BUCKET = "demo"  # the bucket of the S3 lake
AWS_CONN_ID = "aws_default"  # the Amazon provider's default connection id, which the DAG's aws_conn_id names
ICEBERG_CATALOG = "liftbridge"  # the ingest job's default --iceberg-catalog
MARK = "LIFTBRIDGE_DEMO_RUN"  # in the environment of every process an airflow command starts (see end_session)
log = logging.getLogger("demo")


@dataclass
class Lake:
    """Where a demo run's lake is: a local folder, or a prefix of the demo's bucket on the S3 gateway."""

    lake_format: str
    output: str  # the DAG's output_path: a folder, or s3a://bucket/prefix
    env: dict[str, str] = field(default_factory=dict)  # what the S3 lake adds to Airflow's environment
    s3: S3Settings | None = None
    s3_root: Path | None = None  # the S3 gateway's folder (its data/<bucket>/ holds the lake's objects)
    iceberg_catalog_uri: str = ""  # the S3 lake's SQL catalog (a local file)


def airflow_env(brokers: list[str], lake: Lake, mark: str) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    # A developer's own AWS keys, profile or token must not reach the demo's Spark, delta-rs or pyiceberg.
    inherited = {k: v for k, v in os.environ.items() if lake.s3 is None or not k.startswith("AWS_")}
    return {
        **inherited,
        "AIRFLOW_HOME": str(AIRFLOW_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_LIFTBRIDGE_DEFAULT": json.dumps({"conn_type": "liftbridge", "host": ",".join(brokers)}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),  # spark-submit from pip's pyspark
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        MARK: mark,
        **lake.env,
    }


def airflow(env: dict[str, str], *args: str) -> None:
    """Run ``airflow ARGS`` in a session of its own; then kill what it left (its session, and whatever carries
    this demo's mark in its environment: task processes in sessions of their own, spark-submit, its JVM)."""
    setpriv = shutil.which("setpriv")  # util-linux: the command dies with this process even if it is SIGKILLed
    tie = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
    command = [*tie, str(Path(sys.executable).with_name("airflow")), *args]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = process.communicate()
    finally:
        end_session(process, marked=(MARK, env[MARK]))
    if process.returncode != 0:
        sys.stderr.write(stdout[-6000:].decode(errors="replace") + stderr[-6000:].decode(errors="replace"))
        raise SystemExit(f"`airflow {' '.join(args[:3])}` failed (exit {process.returncode})")


def s3_lake(lake_format: str, stack: ExitStack) -> Lake:
    """Start the S3 gateway on ``stack`` (its folder ``out/s3-lake[-FORMAT]/``, made anew and kept after the
    demo), make the bucket, and describe the lake for Airflow: the ``aws`` connection, S3A's jars, Iceberg's
    catalog."""
    from liftbridge_provider.devserver.s3 import s3a_jars, start_s3  # noqa: PLC0415 - LAKE=s3 only

    name = OUTPUT.name + ("" if lake_format == "parquet" else f"-{lake_format}")
    root = OUTPUT.with_name(f"s3-{name}")
    shutil.rmtree(root, ignore_errors=True)
    jars = s3a_jars()  # DevServerError saying to run `make tools` when they are missing
    server = stack.enter_context(start_s3(data_dir=root))
    log.info("S3 gateway (versitygw) running at %s, its files in %s", server.endpoint, server.data_dir)
    server.create_bucket(BUCKET)
    settings = server.settings
    # The Amazon provider's aws connection, as a user keeps it: keys as login and password, the endpoint and
    # region in the extras. The job maps it to S3A, delta-rs and pyiceberg (docs/spark.md, "Object storage").
    connection = {
        "conn_type": "aws",
        "login": settings.access_key,
        "password": settings.secret_key,
        "extra": {"endpoint_url": server.endpoint, "region_name": settings.region},
    }
    # Spark's own configuration folder: S3A's jars for every spark-submit (no key: those come from the connection).
    spark_conf = root / "spark-conf"
    spark_conf.mkdir()
    (spark_conf / "spark-defaults.conf").write_text(f"spark.jars {','.join(str(jar) for jar in jars)}\n")
    env = {f"AIRFLOW_CONN_{AWS_CONN_ID.upper()}": json.dumps(connection), "SPARK_CONF_DIR": str(spark_conf)}
    catalog_uri = ""
    if lake_format == "iceberg":  # a SQLite catalog cannot live in a bucket: one on a local file, named
        catalog_uri = f"sqlite:///{root / 'iceberg-catalog.db'}"
        prefix = f"PYICEBERG_CATALOG__{ICEBERG_CATALOG.upper()}__"
        env.update({f"{prefix}TYPE": "sql", f"{prefix}URI": catalog_uri})
    return Lake(lake_format, f"s3a://{BUCKET}/{name}", env, settings, root, catalog_uri)


def local_lake(lake_format: str) -> Lake:
    output = OUTPUT if lake_format == "parquet" else OUTPUT.with_name(f"{OUTPUT.name}-{lake_format}")
    shutil.rmtree(output, ignore_errors=True)
    return Lake(lake_format, str(output))


def _pairs(rows: Any) -> list[tuple[int, int]]:
    return sorted((r["partition"], r["offset"]) for r in rows.to_pylist())


def lake_offsets(lake: Lake) -> list[tuple[int, int]]:
    """(partition, offset) of every row the lake holds, as a reader of that format sees them."""
    if lake.s3 is not None:
        return s3_lake_offsets(lake, lake.s3)
    output = Path(lake.output)
    if lake.lake_format == "parquet":
        folders = sorted((output / f"stream={STREAM}").glob("partition=*/range=*"))
        tables = [pq.read_table(f, columns=["partition", "offset"]) for f in folders]
        return sorted(pair for t in tables for pair in _pairs(t))
    if lake.lake_format == "delta":
        from deltalake import DeltaTable  # noqa: PLC0415 - the spark extra

        if not (output / "_delta_log").exists():
            return []
        return _pairs(DeltaTable(str(output)).to_pyarrow_table(columns=["partition", "offset"]))
    return iceberg_offsets({"uri": f"sqlite:///{output}/catalog.db", "warehouse": f"file://{output}"})


RANGE_FILE = re.compile(r"/partition=\d+/range=[^/]+/[^/_.][^/]*\.parquet$")


def s3_lake_offsets(lake: Lake, settings: S3Settings) -> list[tuple[int, int]]:
    """:func:`lake_offsets` of a lake in the bucket, read with the gateway's keys (pyarrow's S3 filesystem,
    delta-rs's storage options, pyiceberg's FileIO: ``S3Settings``, the one source of them)."""
    location = lake.output.split("://", 1)[1]  # bucket/prefix
    if lake.lake_format == "parquet":
        from pyarrow import fs  # noqa: PLC0415

        s3 = fs.S3FileSystem(**settings.pyarrow_options())
        stream = f"{location}/stream={STREAM}"
        found = s3.get_file_info(fs.FileSelector(stream, recursive=True, allow_not_found=True))
        files = sorted(i.path for i in found if i.type == fs.FileType.File and RANGE_FILE.search(i.path))
        tables = [pq.read_table(f, columns=["partition", "offset"], filesystem=s3) for f in files]
        return sorted(pair for t in tables for pair in _pairs(t))
    if lake.lake_format == "delta":
        from deltalake import DeltaTable  # noqa: PLC0415 - the spark extra

        uri, options = f"s3://{location}", settings.delta_storage_options()
        if not DeltaTable.is_deltatable(uri, storage_options=options):
            return []
        return _pairs(DeltaTable(uri, storage_options=options).to_pyarrow_table(columns=["partition", "offset"]))
    return iceberg_offsets({"uri": lake.iceberg_catalog_uri, "warehouse": f"s3://{location}"}, settings)


def iceberg_offsets(catalog: Mapping[str, str], settings: S3Settings | None = None) -> list[tuple[int, int]]:
    from pyiceberg.catalog import load_catalog  # noqa: PLC0415 - the iceberg extra

    file_io = settings.pyiceberg_properties() if settings is not None else {}
    loaded = load_catalog(ICEBERG_CATALOG, type="sql", **catalog, **file_io)
    name = f"{ICEBERG_CATALOG}.{STREAM.replace('-', '_')}"
    if not loaded.table_exists(name):
        return []
    return _pairs(loaded.load_table(name).scan(selected_fields=("partition", "offset")).to_arrow())


def _terminated(signum: int, _frame: object) -> NoReturn:
    raise SystemExit(128 + signum)  # so the servers and what airflow left are stopped on the way out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the example ingestion DAG end to end")
    parser.add_argument("--format", choices=FORMATS, default=os.environ.get("FORMAT") or "parquet")
    parser.add_argument(
        "--lake", choices=LAKES, default=os.environ.get("LAKE") or "local", help="local folder or the S3 gateway"
    )
    args = parser.parse_args(argv)
    lake_format = args.format
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    signal.signal(signal.SIGTERM, _terminated)
    AIRFLOW_HOME.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        lake = s3_lake(lake_format, stack) if args.lake == "s3" else local_lake(lake_format)
        server = stack.enter_context(start_single())
        client = stack.enter_context(LiftbridgeClient(server.brokers))
        log.info("liftbridge running at %s", server.brokers[0])
        env = airflow_env(server.brokers, lake, mark=secrets.token_hex(8))
        airflow(env, "db", "migrate")
        seen: list[tuple[int, int]] = []
        for run, batch in enumerate(BATCHES, start=1):
            conf = {"batch_size": batch, "output_path": lake.output, "stream": STREAM, "lake_format": lake_format}
            if lake.s3 is not None:
                conf["aws_conn_id"] = AWS_CONN_ID
            airflow(env, "dags", "test", "liftbridge_spark_ingest", "--conf", json.dumps(conf))
            now = lake_offsets(lake)
            new = len(now) - len(seen)
            log.info("run %d: published %d, ingested %d rows%s (the %s lake holds %d)", run, batch, new,
                     "" if new else ": nothing new", lake_format, len(now))  # fmt: skip
            seen = now
        published = sum(BATCHES)
        ingested = len(seen)
        twice = len(seen) - len(set(seen))
        partitions = len(client.stream_info(STREAM).partitions)
        cursors = {p: client.fetch_cursor("spark-ingest", STREAM, p) for p in range(partitions)}
        high_watermarks = {p: client.fetch_partition_metadata(STREAM, p).high_watermark for p in range(partitions)}
    where = f"{lake.output}/stream={STREAM}" if lake_format == "parquet" else lake.output
    if lake.s3_root is not None:
        where += f" (the gateway's files: {lake.s3_root / 'data' / BUCKET})"
    log.info("output: %s", where)
    log.info("cursors (last ingested offset per partition): %s; high watermarks: %s", cursors, high_watermarks)
    kind = f"{lake_format} lake" + (" on S3" if lake.s3 is not None else "")
    if ingested != published or twice or cursors != high_watermarks:
        log.error("MISMATCH: published %d messages, %d rows in the %s (%d twice)", published, ingested, kind, twice)
        return 1
    servers = "servers stopped" if lake.s3 is not None else "server stopped"
    log.info("demo ok: %d messages published, %d rows in the %s, each offset once; %s", published, ingested, kind,
             servers)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
