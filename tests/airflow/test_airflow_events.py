"""The event listener in real Airflow: `airflow dags test` with ``[liftbridge_events]`` on, a real node.

`airflow dags test` runs the tasks in its own process and fires the same
listener hooks a task process fires (task running, success, failed), and the
DAG run's end; the run's start (``dag_run.running``) only the scheduler fires
(tests/system/test_event_listener.py runs the real scheduler for it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from liftbridge_provider.client import LiftbridgeClient, partition_by_key
from liftbridge_provider.devserver import DevServer, start_single
from tests.airflow.airflow_runs import AIRFLOW, DagRun, run_dag
from tests.airflow.statsd import StatsdListener

FLAKY = '''
import pathlib

def fail_first_try(marker):
    """Fail the first time (``marker`` remembers it), succeed after."""
    if not pathlib.Path(marker).exists():
        pathlib.Path(marker).touch()
        raise RuntimeError("first try fails on purpose")
'''


def events_env(
    server: DevServer | None, stream: str, brokers: list[str] | None = None, **options: str
) -> dict[str, str]:
    """The connection to ``brokers`` (default: the server's) and the listener switched on for ``stream``."""
    connection = {"conn_type": "liftbridge", "host": ",".join(brokers or (server.brokers if server else []))}
    env = {
        "AIRFLOW_CONN_LIFTBRIDGE_DEFAULT": json.dumps(connection),
        "AIRFLOW__LIFTBRIDGE_EVENTS__ENABLED": "True",
        "AIRFLOW__LIFTBRIDGE_EVENTS__STREAM": stream,
    }
    env.update({f"AIRFLOW__LIFTBRIDGE_EVENTS__{k.upper()}": v for k, v in options.items()})
    return env


def run_events(client: LiftbridgeClient, stream: str, run: DagRun, partitions: int) -> tuple[int, list[dict[str, Any]]]:
    """The partition the run's key picks, and the events of ``run`` in the order that partition holds them
    (after checking that no other partition holds any)."""
    assert run.run_id is not None
    key = f"{run.dag_id}/{run.run_id}".encode()
    found: dict[int, list[dict[str, Any]]] = {}
    for partition in range(partitions):
        end = client.fetch_partition_metadata(stream, partition).high_watermark + 1
        messages = [m for m in client.read_range(stream, partition, 0, end) if m.key == key]
        found[partition] = [json.loads(m.value) for m in messages]
    chosen = partition_by_key(stream, key, b"", partitions)
    assert {p for p, events in found.items() if events} == {chosen}, found
    return chosen, found[chosen]


def test_a_dag_runs_events_arrive_in_order_on_the_partition_of_its_key(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    """A task, a task that fails once and is retried, and a mapped task: every state change reaches the
    stream as JSON, on one partition, each task try's events in order and the run's end last."""
    stream = f"airflow-events-{uuid.uuid4().hex[:8]}"
    client.create_stream(stream, stream, partitions=3)
    (airflow_home / "dags" / "events_functions.py").write_text(FLAKY)
    marker = tmp_path / "failed-once"
    body = f"""
        @task
        def first():
            return [1, 2]

        @task(retries=1, retry_delay=0)
        def flaky():
            __import__("events_functions").fail_first_try({str(marker)!r})

        @task
        def each(x):
            return x

        numbers = first()
        numbers >> flaky() >> each.expand(x=numbers)
    """
    run = run_dag(airflow_home, body, events_env(liftbridge_server, stream))
    assert run.ok(), run.output[-3000:]
    _, events = run_events(client, stream, run, 3)
    steps = [(e["event"], e.get("task_id"), e.get("map_index"), e.get("try_number"), e["state"]) for e in events]
    mapped = [s for s in steps if s[1] == "each"]
    assert steps[:6] == [
        ("task_instance.running", "first", -1, 1, "running"),
        ("task_instance.success", "first", -1, 1, "success"),
        ("task_instance.running", "flaky", -1, 1, "running"),
        ("task_instance.failed", "flaky", -1, 1, "up_for_retry"),
        ("task_instance.running", "flaky", -1, 2, "running"),
        ("task_instance.success", "flaky", -1, 2, "success"),
    ]
    assert sorted(mapped) == [
        ("task_instance.running", "each", 0, 1, "running"),
        ("task_instance.running", "each", 1, 1, "running"),
        ("task_instance.success", "each", 0, 1, "success"),
        ("task_instance.success", "each", 1, 1, "success"),
    ]
    for index in (0, 1):
        tries = [s[0] for s in mapped if s[2] == index]
        assert tries == ["task_instance.running", "task_instance.success"], mapped
    assert steps[6:10] == [s for s in steps if s[1] == "each"], "the mapped tasks run after flaky"
    assert steps[10:] == [("dag_run.success", None, None, None, "success")]
    assert all((e["dag_id"], e["run_id"]) == (run.dag_id, run.run_id) for e in events)
    assert "first try fails on purpose" in events[3]["error"]
    assert events[1]["start_date"] is not None
    assert events[1]["end_date"] is not None
    assert events[-1]["run_type"] == "manual"


def test_only_the_chosen_events_are_published(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    stream = f"airflow-events-{uuid.uuid4().hex[:8]}"
    client.create_stream(stream, stream)
    body = """
        @task
        def only():
            return 1

        only()
    """
    env = events_env(liftbridge_server, stream, events="dag_run.success,task_instance.success")
    run = run_dag(airflow_home, body, env)
    assert run.ok(), run.output[-3000:]
    _, events = run_events(client, stream, run, 1)
    assert [e["event"] for e in events] == ["task_instance.success", "dag_run.success"]


@pytest.mark.parametrize("missing", ["node", "stream", "connection"])
def test_without_liftbridge_or_the_stream_the_run_succeeds_and_the_drops_are_counted_and_logged(
    airflow_home: Path, liftbridge_server: DevServer, missing: str
) -> None:
    """With the node stopped, the stream missing, or the connection missing (looked up in the task's own
    hooks), every task and the run still succeed; each event that could not be published is counted in
    liftbridge.events.dropped (StatsD) and logged."""
    node = start_single()
    brokers = node.brokers
    if missing == "node":
        node.stop(timeout=5)
    statsd = StatsdListener()
    body = """
        @task
        def one():
            return 1

        @task
        def two(x):
            return x + 1

        two(one())
    """
    try:
        options = {"retry_interval": "0", "publish_timeout": "1", "flush_timeout": "1"}
        if missing == "connection":
            options["conn_id"] = "no_such_connection"
        env = {**events_env(None, "no-such-stream", brokers=brokers, **options), **statsd.env}
        run = run_dag(airflow_home, body, env)
        assert run.ok(), run.output[-3000:]
        assert run.states == {"one": "success", "two": "success"}
        statsd.received("")
        by_reason: dict[str, int] = {}
        for line in statsd.lines:
            name, value = line.split(":", 1)
            if name.startswith("airflow.liftbridge.events.dropped."):
                reason = name.rsplit(".", 1)[1]
                by_reason[reason] = by_reason.get(reason, 0) + int(value.split("|")[0])
        # one/two: running and success each, the run's success: 5 events, none published, each counted once
        # (as a failed publish, or as left when a process stopped, by how long the refusal took to come)
        assert set(by_reason) <= {"publish_failed", "stopping"}, statsd.lines
        assert sum(by_reason.values()) == 5, statsd.lines
        assert "Liftbridge event listener: dropped 1 event(s) for stream 'no-such-stream'" in run.output
        if missing == "connection":
            assert "LookupError: connection 'no_such_connection': AirflowNotFoundException" in run.output
    finally:
        statsd.close()
        node.stop(timeout=5)


def test_bad_options_are_refused_by_name_and_the_run_goes_on_without_the_listener(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    stream = f"airflow-events-{uuid.uuid4().hex[:8]}"
    client.create_stream(stream, stream)
    """A bad option keeps the listener off in every process, and says why where Airflow lists plugin import
    errors (the API's /plugins/importErrors, the UI) and in the process's log; the DAG run is not affected."""
    env = events_env(liftbridge_server, stream, queue_size="none")
    errors = "from airflow import plugins_manager; import json; print(json.dumps(plugins_manager.get_import_errors()))"
    result = subprocess.run(
        [sys.executable, "-c", errors], env={**os.environ, **env}, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    listed = json.loads(result.stdout.strip().splitlines()[-1])
    assert "[liftbridge_events] queue_size must be a whole number >= 1, got 'none'" in listed.values(), listed
    body = """
        @task
        def only():
            return 1

        only()
    """
    run = run_dag(airflow_home, body, env)
    assert run.ok(), run.output[-3000:]
    assert "[liftbridge_events] queue_size must be a whole number >= 1, got 'none'" in run.output
    assert client.fetch_partition_metadata(stream, 0).high_watermark == -1, "nothing was published"


def test_airflow_config_list_shows_the_options_with_defaults_and_descriptions(airflow_home: Path) -> None:
    command = [AIRFLOW, "config", "list", "--section", "liftbridge_events", "--show-values", "--include-descriptions"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__LIFTBRIDGE_EVENTS__")}
    result = subprocess.run(command, env=clean, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    shown = result.stdout.splitlines()
    for line in ("enabled = False", "conn_id = liftbridge_default", "stream = airflow-events",
                 "events = dag_run,task_instance", "queue_size = 10000", "publish_timeout = 5.0",
                 "retry_interval = 10.0", "flush_timeout = 5.0", "dag_run_end_delay = 2.0"):  # fmt: skip
        assert line in shown, result.stdout
    assert "# Events each process holds while they wait to be published." in " ".join(shown)


def test_loading_the_listener_loads_neither_the_client_nor_grpc() -> None:
    """The plugin's listener is imported by every Airflow process (scheduler, workers, API server): it and
    the telemetry it counts drops with must not load the client or grpc until it publishes."""
    probe = (
        "import sys, liftbridge_provider.events.listener, liftbridge_provider.telemetry; "
        "print(sorted(m for m in ('grpc', 'liftbridge_provider.client') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", result.stdout


def test_no_event_carries_a_value_airflow_masks_in_the_task_log(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """A task reads a connection with a password, a Variable whose name Airflow deems sensitive and a value
    it registers with mask_secret, then fails with all three in its error: the failed event on the stream
    carries the masked form (***) where Airflow's task log does, never the values. (`airflow dags test` prints
    the task's log to the console unmasked, so the expected text is spelled out here; under the scheduler,
    tests/system/test_event_listener.py compares with the task's log file.)"""
    stream = f"airflow-events-{uuid.uuid4().hex[:8]}"
    client.create_stream(stream, stream)
    secrets = {"password": "Pg-s3cret-8f2a1c", "variable": "Var-s3cret-77b1e0", "registered": "Reg-s3cret-19c4d2"}
    body = f"""
        @task
        def leaky():
            from airflow.sdk import BaseHook, Variable
            from airflow.sdk.log import mask_secret

            uri = BaseHook.get_connection("warehouse_db").get_uri()
            variable = Variable.get("warehouse_password")
            mask_secret({secrets["registered"]!r})
            raise RuntimeError(f"login failed for {{uri}} (variable {{variable}}, token {secrets["registered"]})")

        leaky()
    """
    env = {
        **events_env(liftbridge_server, stream),
        "AIRFLOW_CONN_WAREHOUSE_DB": f"postgresql://etl:{secrets['password']}@db.example:5432/etl",
        "AIRFLOW_VAR_WAREHOUSE_PASSWORD": secrets["variable"],
    }
    run = run_dag(airflow_home, body, env)
    assert run.states == {"leaky": "failed"}, run.output[-3000:]
    _, events = run_events(client, stream, run, 1)
    (failed,) = [e for e in events if e["event"] == "task_instance.failed"]
    assert "login failed for postgres://etl:***@db.example:5432/etl (variable ***, token ***)" in failed["error"]
    published = json.dumps(events)
    for name, secret in secrets.items():
        assert secret not in published, f"the {name} reached the stream: {failed['error']}"
