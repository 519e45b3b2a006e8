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
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.devserver import start_single

ROOT = Path(__file__).resolve().parents[1]
# Overridable so the system test can run the demo in a temporary folder.
AIRFLOW_HOME = Path(os.environ.get("DEMO_AIRFLOW_HOME", ROOT / ".airflow"))
OUTPUT = Path(os.environ.get("DEMO_OUTPUT", ROOT / "out" / "lake"))
FORMATS = ("parquet", "delta", "iceberg")
STREAM = "demo-events"
BATCHES = [1000, 500, 0]  # events published by each run; the last run finds nothing new
log = logging.getLogger("demo")


def airflow_env(brokers: list[str]) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "AIRFLOW_HOME": str(AIRFLOW_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_LIFTBRIDGE_DEFAULT": json.dumps({"conn_type": "liftbridge", "host": ",".join(brokers)}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),  # spark-submit from pip's pyspark
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def airflow(env: dict[str, str], *args: str) -> None:
    command = [str(Path(sys.executable).with_name("airflow")), *args]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-6000:] + result.stderr[-6000:])
        raise SystemExit(f"`airflow {' '.join(args[:3])}` failed (exit {result.returncode})")


def lake_offsets(lake_format: str, output: Path) -> list[tuple[int, int]]:
    """(partition, offset) of every row the lake holds, as a reader of that format sees them."""
    if lake_format == "parquet":
        folders = sorted((output / f"stream={STREAM}").glob("partition=*/range=*"))
        tables = [pq.read_table(f, columns=["partition", "offset"]) for f in folders]
        return sorted((r["partition"], r["offset"]) for t in tables for r in t.to_pylist())
    if lake_format == "delta":
        from deltalake import DeltaTable  # noqa: PLC0415 - the spark extra

        if not (output / "_delta_log").exists():
            return []
        table = DeltaTable(str(output)).to_pyarrow_table(columns=["partition", "offset"])
        return sorted((r["partition"], r["offset"]) for r in table.to_pylist())
    from pyiceberg.catalog import load_catalog  # noqa: PLC0415 - the iceberg extra

    catalog = load_catalog("liftbridge", type="sql", uri=f"sqlite:///{output}/catalog.db", warehouse=f"file://{output}")
    name = f"liftbridge.{STREAM.replace('-', '_')}"
    if not catalog.table_exists(name):
        return []
    rows = catalog.load_table(name).scan(selected_fields=("partition", "offset")).to_arrow()
    return sorted((r["partition"], r["offset"]) for r in rows.to_pylist())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the example ingestion DAG end to end")
    parser.add_argument("--format", choices=FORMATS, default=os.environ.get("FORMAT") or "parquet")
    lake_format = parser.parse_args(argv).format
    output = OUTPUT if lake_format == "parquet" else OUTPUT.with_name(f"{OUTPUT.name}-{lake_format}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    shutil.rmtree(output, ignore_errors=True)
    AIRFLOW_HOME.mkdir(parents=True, exist_ok=True)
    with start_single() as server, LiftbridgeClient(server.brokers) as client:
        log.info("liftbridge running at %s", server.brokers[0])
        env = airflow_env(server.brokers)
        airflow(env, "db", "migrate")
        seen: list[tuple[int, int]] = []
        for run, batch in enumerate(BATCHES, start=1):
            conf = {"batch_size": batch, "output_path": str(output), "stream": STREAM, "lake_format": lake_format}
            airflow(env, "dags", "test", "liftbridge_spark_ingest", "--conf", json.dumps(conf))
            now = lake_offsets(lake_format, output)
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
    log.info("output: %s", output / f"stream={STREAM}" if lake_format == "parquet" else output)
    log.info("cursors (last ingested offset per partition): %s; high watermarks: %s", cursors, high_watermarks)
    if ingested != published or twice or cursors != high_watermarks:
        log.error("MISMATCH: published %d messages, %d rows in the %s lake (%d twice)", published, ingested,
                  lake_format, twice)  # fmt: skip
        return 1
    log.info(
        "demo ok: %d messages published, %d rows in the %s lake, each offset once; server stopped",
        published,
        ingested,
        lake_format,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
