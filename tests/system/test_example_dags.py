"""The example DAGs, run for real: the main job (what `make demo` runs) and the admin DAG."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from liftbridge_provider.client import LiftbridgeClient, partition_by_round_robin
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.devserver.config import free_port
from liftbridge_provider.devserver.leftovers import end_session
from tests.system.airflow_standalone import STANDALONE_ENV, migrate

ROOT = Path(__file__).resolve().parents[2]
FACET = "liftbridge_offsets"  # the dataset facet with the offsets a task read


@pytest.mark.timeout(960)  # the run's own bound (below) ends it first, with its output
def test_main_job_ingests_every_published_message_once(tmp_path: Path) -> None:
    """The main job, with the OpenLineage provider writing its events to a file: the stream and the lake
    show up as the Spark step's input and output (lineage)."""
    lineage = tmp_path / "openlineage.jsonl"
    env = {
        **os.environ,
        "DEMO_AIRFLOW_HOME": str(tmp_path / "airflow"),
        "DEMO_OUTPUT": str(tmp_path / "lake"),
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(lineage), "append": True}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "liftbridge-demo",
    }
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
    assert "demo ok: 1500 messages published, 1500 rows in the parquet lake, each offset once" in printed
    assert len(list((tmp_path / "lake" / "stream=demo-events").glob("partition=*/range=*"))) == 6
    assert_lineage(lineage, tmp_path / "lake")


@pytest.mark.timeout(960)  # the run's own bound (below) ends it first, with its output
def test_the_main_job_lands_every_message_once_in_an_iceberg_table(tmp_path: Path) -> None:
    """`make demo FORMAT=iceberg`: the same DAG into an Iceberg table of the embedded SQLite catalog, with
    nothing else to start; the demo checks each offset is in the table once."""
    env = {**os.environ, "DEMO_AIRFLOW_HOME": str(tmp_path / "airflow"), "DEMO_OUTPUT": str(tmp_path / "lake")}
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "demo.py"), "--format", "iceberg"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    printed = result.stdout + result.stderr
    assert result.returncode == 0, printed[-5000:]
    assert "run 2: published 500, ingested 500 rows" in printed
    assert "demo ok: 1500 messages published, 1500 rows in the iceberg lake, each offset once" in printed
    assert (tmp_path / "lake-iceberg" / "catalog.db").is_file()


def assert_lineage(events_file: Path, lake: Path) -> None:
    """Completed task events name the stream (namespace liftbridge://host:port, name the stream) as publish's
    output, freeze's input, and the Spark step's input with the lake (a file dataset) as its output."""
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    done: dict[str, tuple[set[tuple[str, str]], set[tuple[str, str]]]] = {}
    for event in events:
        if event.get("eventType") != "COMPLETE" or "." not in event["job"]["name"]:
            continue
        task = event["job"]["name"].split(".", 1)[1]
        inputs, outputs = done.setdefault(task, (set(), set()))
        inputs.update((d["namespace"], d["name"]) for d in event.get("inputs", []))
        outputs.update((d["namespace"], d["name"]) for d in event.get("outputs", []))
    streams = {(ns, name) for ns, name in done["spark_ingest"][0] if ns.startswith("liftbridge://127.0.0.1:")}
    assert {name for _, name in streams} == {"demo-events"}, done
    assert ("file", str(lake)) in done["spark_ingest"][1], done["spark_ingest"]
    assert streams <= done["publish_events"][1], done["publish_events"]
    assert streams <= done["freeze_ranges"][0], done["freeze_ranges"]
    assert_offsets_in_lineage(events)


def assert_offsets_in_lineage(events: list[dict[str, Any]]) -> None:
    """The freeze's, the Spark step's and the commit's completed events carry the run's frozen ranges as the
    stream's ``liftbridge_offsets`` facet: in the demo's three runs they span 1000, 500 and 0 offsets, and each
    run's ranges start where the previous run's ended, partition by partition. (`airflow dags test` runs a
    DAG run's tasks in one process, whose hook lineage collector Airflow keeps, so a task's event also lists
    the same ranges as reported by the tasks before it: every facet of one event is alike.)"""
    per_task: dict[str, list[list[tuple[int, int, int]]]] = {}
    for event in events:
        if event.get("eventType") != "COMPLETE" or "." not in event["job"]["name"]:
            continue
        task = event["job"]["name"].split(".", 1)[1]
        facets = [d["facets"][FACET] for d in event.get("inputs", []) if FACET in d.get("facets", {})]
        if task in ("freeze_ranges", "spark_ingest", "commit_cursor"):
            found = {tuple((r["partition"], r["start"], r["end"]) for r in f["ranges"]) for f in facets}
            assert len(found) == 1, (task, facets)
            assert {f["cursorId"] for f in facets} == {"spark-ingest"}, facets
            per_task.setdefault(task, []).append(list(found.pop()))
    assert per_task["freeze_ranges"] == per_task["spark_ingest"] == per_task["commit_cursor"], per_task
    runs = per_task["freeze_ranges"]
    assert [sum(end - start for _, start, end in run) for run in runs] == [1000, 500, 0], runs
    for earlier, later in itertools.pairwise(runs):
        assert [(p, end) for p, _, end in earlier] == [(p, start) for p, start, _ in later], runs


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


@pytest.mark.timeout(720)  # the run's own bound (below) ends it first, with its output
def test_event_driven_example_ingests_every_published_message(liftbridge_server: DevServer, tmp_path: Path) -> None:
    """dags/liftbridge_event_ingest.py under `airflow standalone`: watcher -> asset events -> Spark -> Parquet."""
    stream, lake = f"events-{uuid.uuid4().hex[:8]}", tmp_path / "lake"
    env = _standalone_env(tmp_path / "airflow", liftbridge_server, stream, lake)
    migrate(env)
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        client.create_stream(stream, stream, partitions=3)
        standalone = subprocess.Popen(
            [str(Path(sys.executable).with_name("airflow")), "standalone"],
            env=env,
            stdout=(tmp_path / "standalone.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            # 1,200 messages: two batches fire by count (500), the rest after max_wait.
            values = [f"event {i}".encode() for i in range(1200)]
            client.publish_batch(stream, values, partitioner=partition_by_round_robin())
            rows = _wait_for_rows(lake / f"stream={stream}", 1200, tmp_path / "standalone.log")
        finally:
            end_session(standalone, ("AIRFLOW_HOME", env["AIRFLOW_HOME"]))
    assert len(rows) == 1200
    assert len(set(rows)) == 1200, "a message was ingested twice"
    assert {partition for partition, _ in rows} == {0, 1, 2}


def _standalone_env(home: Path, server: DevServer, stream: str, lake: Path) -> dict[str, str]:
    port = free_port()
    return {
        **os.environ,
        **STANDALONE_ENV,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW_CONN_LIFTBRIDGE_DEFAULT": json.dumps({"conn_type": "liftbridge", "host": server.brokers[0]}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        "LIFTBRIDGE_EVENTS_STREAM": stream,
        "LIFTBRIDGE_EVENTS_OUTPUT": str(lake),
    }


def _wait_for_rows(folder: Path, expected: int, log: Path, timeout: float = 600) -> list[tuple[int, int]]:
    """(partition, offset) of every Parquet row under ``folder``, once there are ``expected`` of them."""
    deadline = time.monotonic() + timeout
    rows: list[tuple[int, int]] = []
    while time.monotonic() < deadline:
        rows = []
        for file in sorted(folder.glob("partition=*/range=*/*.parquet")):
            table = pq.ParquetFile(file).read(columns=["partition", "offset"])
            rows += zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True)
        if len(rows) >= expected:
            return rows
        time.sleep(3)
    raise AssertionError(f"{len(rows)} of {expected} rows after {timeout:g}s; log:\n{log.read_text()[-6000:]}")
