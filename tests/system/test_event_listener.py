"""The event listener under the real scheduler: `airflow standalone` (scheduler with LocalExecutor, DAG
processor, API server, triggerer) publishing to a real Liftbridge node.

Under the scheduler the events come from several processes: the run's start and end from the scheduler,
each task's from the task's own process. The test checks that they reach the stream in the run's order, on
the partition of the run's key; then stops the node and checks that the next DAG run still succeeds while
every one of its events is counted as dropped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from liftbridge_provider.client import LiftbridgeClient, partition_by_key
from liftbridge_provider.devserver import DevServer, start_single
from liftbridge_provider.devserver.config import free_port
from liftbridge_provider.devserver.leftovers import end_session
from tests.airflow.statsd import StatsdListener
from tests.system.airflow_standalone import STANDALONE_ENV, migrate

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
WAIT = 300.0  # seconds a DAG run may take to be scheduled, run and reported under `airflow standalone`
DAGS = """
from datetime import datetime
from airflow.sdk import DAG, task

for dag_id, paused in (("events_in_order", False), ("events_outage", True)):
    with DAG(dag_id, schedule="@once", start_date=datetime(2026, 1, 1), is_paused_upon_creation=paused):
        @task
        def extract():
            return 1

        @task
        def load(x):
            return x + 1

        load(extract())
"""


def standalone_env(home: Path, node: DevServer, stream: str, statsd: StatsdListener) -> dict[str, str]:
    port = free_port()
    return {
        **os.environ,
        **statsd.env,
        **STANDALONE_ENV,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW_CONN_LIFTBRIDGE_DEFAULT": json.dumps({"conn_type": "liftbridge", "host": node.brokers[0]}),
        "AIRFLOW__LIFTBRIDGE_EVENTS__ENABLED": "True",
        "AIRFLOW__LIFTBRIDGE_EVENTS__STREAM": stream,
        "AIRFLOW__LIFTBRIDGE_EVENTS__PUBLISH_TIMEOUT": "2",
        "AIRFLOW__LIFTBRIDGE_EVENTS__FLUSH_TIMEOUT": "2",
        "AIRFLOW__LIFTBRIDGE_EVENTS__RETRY_INTERVAL": "1",
    }


def wait_for(condition: Callable[[], Any], what: str | Callable[[], str], log: Path) -> Any:
    deadline = time.monotonic() + WAIT
    while not (found := condition()):
        if time.monotonic() > deadline:
            said = what if isinstance(what, str) else what()
            pytest.fail(f"no {said} within {WAIT:g}s; airflow standalone's log:\n{log_digest(log)}")
        time.sleep(1)
    return found


def log_digest(log: Path) -> str:
    """The lines of the standalone log that tell a run's story (the scheduler's, the listener's, errors), then
    its tail: the DAG processor's periodic lines alone fill the tail and hide why a run did not end."""
    text = log.read_text(errors="replace")
    telling = ("scheduler", "Liftbridge", "ERROR", "error", "Traceback", "events_", "executor", "triggerer")
    lines = [line for line in text.splitlines() if "dag-processor" not in line and any(t in line for t in telling)]
    return "\n".join(lines[-120:])[-12000:] + "\n--- tail ---\n" + text[-3000:]


def stream_events(client: LiftbridgeClient, stream: str, partitions: int) -> dict[int, list[dict[str, Any]]]:
    found = {}
    for partition in range(partitions):
        end = client.fetch_partition_metadata(stream, partition).high_watermark + 1
        found[partition] = [json.loads(m.value) for m in client.read_range(stream, partition, 0, end)]
    return found


def dag_runs(env: dict[str, str], dag_id: str) -> list[dict[str, Any]]:
    command = [AIRFLOW, "dags", "list-runs", dag_id, "-o", "json"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        return []
    runs: list[dict[str, Any]] = json.loads(result.stdout.strip().splitlines()[-1] or "[]")
    return runs


@pytest.mark.timeout(3 * WAIT + 120)
def test_under_the_scheduler_a_runs_events_arrive_in_order_and_an_outage_only_drops_them(tmp_path: Path) -> None:
    node = start_single()
    statsd = StatsdListener()
    statsd.collect_in_background()
    home, stream = tmp_path / "airflow", f"airflow-events-{uuid.uuid4().hex[:8]}"
    (home / "dags").mkdir(parents=True)
    (home / "dags" / "event_dags.py").write_text(DAGS)
    env = standalone_env(home, node, stream, statsd)
    log = tmp_path / "standalone.log"
    migrate(env)
    with LiftbridgeClient(node.brokers) as client:
        client.create_stream(stream, stream, partitions=3)
        standalone = subprocess.Popen(
            [AIRFLOW, "standalone"], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            check_events_in_order(client, stream, log)
            node.stop(timeout=10)
            check_outage_only_drops(env, statsd, log)
        finally:
            end_session(standalone, ("AIRFLOW_HOME", env["AIRFLOW_HOME"]))
            statsd.close()
            node.stop(timeout=5)


def check_events_in_order(client: LiftbridgeClient, stream: str, log: Path) -> None:
    """events_in_order runs once (@once, unpaused): its six events reach the partition of its key, in order,
    the run's start and end from the scheduler, each task's events from the task's own process."""

    def run_ended() -> list[dict[str, Any]]:
        events = [e for es in stream_events(client, stream, 3).values() for e in es]
        ends = ("dag_run.success", "dag_run.failed")
        return [e for e in events if e["dag_id"] == "events_in_order" and e["event"] in ends]

    def stream_holds() -> list[tuple[str, str | None]]:
        return [(e["event"], e.get("task_id")) for es in stream_events(client, stream, 3).values() for e in es]

    (end,) = wait_for(run_ended, lambda: f"end event of events_in_order (the stream holds: {stream_holds()})", log)
    assert end["event"] == "dag_run.success", f"the run failed; events: {stream_holds()}; log:\n{log_digest(log)}"
    key = f"events_in_order/{end['run_id']}".encode()
    by_partition = stream_events(client, stream, 3)
    chosen = partition_by_key(stream, key, b"", 3)
    held = {p for p, es in by_partition.items() if any(e["run_id"] == end["run_id"] for e in es)}
    assert held == {chosen}
    events = [e for e in by_partition[chosen] if e["run_id"] == end["run_id"]]
    assert [(e["event"], e.get("task_id")) for e in events] == [
        ("dag_run.running", None),
        ("task_instance.running", "extract"),
        ("task_instance.success", "extract"),
        ("task_instance.running", "load"),
        ("task_instance.success", "load"),
        ("dag_run.success", None),
    ]
    scheduler, tasks = {events[0]["pid"], events[-1]["pid"]}, {e["pid"] for e in events[1:-1]}
    assert len(scheduler) == 1, "the scheduler publishes the run's start and end"
    assert len(tasks) == 2, "each task's own process publishes its events"
    assert not scheduler & tasks


def check_outage_only_drops(env: dict[str, str], statsd: StatsdListener, log: Path) -> None:
    """With the node stopped, events_outage runs and succeeds, and each of its six events is counted as
    dropped (from the scheduler and from both task processes) and logged."""
    unpause = subprocess.run(
        [AIRFLOW, "dags", "unpause", "events_outage"], env=env, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert unpause.returncode == 0, unpause.stdout + unpause.stderr

    def outage_run_done() -> list[dict[str, Any]]:
        return [r for r in dag_runs(env, "events_outage") if r["state"] in ("success", "failed")]

    (outage_run,) = wait_for(outage_run_done, "finished run of events_outage", log)
    assert outage_run["state"] == "success"

    def dropped() -> int:
        prefix = "airflow.liftbridge.events.dropped."
        counted = [line.split(":", 1) for line in list(statsd.lines) if line.startswith(prefix)]
        return sum(int(value.split("|")[0]) for _, value in counted)

    def so_far() -> str:
        return f"six dropped events in StatsD (so far: {[x for x in statsd.lines if 'liftbridge' in x]})"

    wait_for(lambda: dropped() >= 6, so_far, log)
    assert dropped() == 6, [x for x in statsd.lines if "liftbridge" in x]
    assert "Liftbridge event listener: dropped 1 event(s)" in log.read_text()
