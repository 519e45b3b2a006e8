"""The example DAGs, run for real: the main job (what `make demo` runs) and the admin DAG."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.devserver import DevServer

ROOT = Path(__file__).resolve().parents[2]


def test_main_job_ingests_every_published_message_once(tmp_path: Path) -> None:
    env = {**os.environ, "DEMO_AIRFLOW_HOME": str(tmp_path / "airflow"), "DEMO_OUTPUT": str(tmp_path / "lake")}
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "demo.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    printed = result.stdout + result.stderr
    assert result.returncode == 0, printed[-5000:]
    assert "run 1: published 1000, ingested 1000 rows" in printed
    assert "run 2: published 500, ingested 500 rows" in printed
    assert "run 3: published 0, ingested 0 rows: nothing new" in printed
    assert "demo ok: 1500 messages published, 1500 rows in Parquet" in printed
    assert len(list((tmp_path / "lake" / "stream=demo-events").glob("partition=*/range=*"))) == 6


def test_stream_admin_dag(liftbridge_server: DevServer, tmp_path: Path) -> None:
    home = tmp_path / "airflow"
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_LIFTBRIDGE_DEFAULT": json.dumps(
            {"conn_type": "liftbridge", "host": liftbridge_server.brokers[0]}
        ),
    }
    airflow = str(Path(sys.executable).with_name("airflow"))
    for command in (["db", "migrate"], ["dags", "test", "liftbridge_stream_admin"]):
        result = subprocess.run([airflow, *command], env=env, capture_output=True, text=True, timeout=300, check=False)
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        assert "admin-demo" not in client.fetch_metadata().streams, "the DAG ends by deleting its stream"
