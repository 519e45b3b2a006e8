"""The main job (`make demo`): the example ingestion DAG end to end, on embedded defaults.

Starts a Liftbridge node on 127.0.0.1, prepares an Airflow home with a SQLite
metadata DB in ``.airflow/`` (the project's ``dags/`` as DAG folder, the
connections from the environment), then runs ``airflow dags test
liftbridge_spark_ingest`` three times: two batches of events, then a run with
nothing new. It prints the rows ingested per partition and run, the output
path and the cursor positions, checks that the Parquet rows equal the
messages published, and stops the node. Exits non-zero on any mismatch.
"""

from __future__ import annotations

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


def rows_per_range() -> dict[str, int]:
    """Parquet rows in each range folder: ``partition=P/range=A-B`` -> rows."""
    folders = sorted((OUTPUT / f"stream={STREAM}").glob("partition=*/range=*"))
    return {f"{f.parent.name}/{f.name}": pq.read_table(f).num_rows for f in folders}


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    shutil.rmtree(OUTPUT, ignore_errors=True)
    AIRFLOW_HOME.mkdir(exist_ok=True)
    with start_single() as server, LiftbridgeClient(server.brokers) as client:
        log.info("liftbridge running at %s", server.brokers[0])
        env = airflow_env(server.brokers)
        airflow(env, "db", "migrate")
        seen: dict[str, int] = {}
        for run, batch in enumerate(BATCHES, start=1):
            conf = json.dumps({"batch_size": batch, "output_path": str(OUTPUT), "stream": STREAM})
            airflow(env, "dags", "test", "liftbridge_spark_ingest", "--conf", conf)
            now = rows_per_range()
            new = {folder: rows for folder, rows in now.items() if folder not in seen}
            seen = now
            log.info("run %d: published %d, ingested %d rows: %s", run, batch, sum(new.values()), new or "nothing new")
        published = sum(BATCHES)
        ingested = sum(seen.values())
        partitions = len(client.stream_info(STREAM).partitions)
        cursors = {p: client.fetch_cursor("spark-ingest", STREAM, p) for p in range(partitions)}
        high_watermarks = {p: client.fetch_partition_metadata(STREAM, p).high_watermark for p in range(partitions)}
    log.info("output: %s", OUTPUT / f"stream={STREAM}")
    log.info("cursors (last ingested offset per partition): %s; high watermarks: %s", cursors, high_watermarks)
    if ingested != published or cursors != high_watermarks:
        log.error("MISMATCH: published %d messages, %d rows in Parquet", published, ingested)
        return 1
    log.info(
        "demo ok: %d messages published, %d rows in Parquet, each range written once; server stopped",
        published,
        ingested,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
