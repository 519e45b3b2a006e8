"""The event listener beside real task processes (`airflow standalone`: scheduler, LocalExecutor, API server):
it neither fails an async task nor publishes a secret the task's log masks.

A task process talks to its supervisor over one channel (the task SDK's ``SUPERVISOR_COMMS``). On Airflow
3.3 a plain (sync) request from an async task's event loop fails the task with ``DeadlockImminentError``
whenever another thread holds that channel; on 3.1 two threads on it can swap each other's answers. So the
listener must never look its connection up beside the task. The test makes the window of such a lookup
wide and certain, without touching Airflow's channel: the API server answers the liftbridge connection
after ``SLOW`` seconds (:class:`SlowConnections`, its secrets backend), and the task process's own secrets
backend (:class:`GatedConnections`) holds a lookup made off the main thread until the task has made its
first async request. The async task then makes a plain XCom push while such a lookup would be in flight.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.devserver import start_single
from liftbridge_provider.devserver.leftovers import end_session
from tests.airflow.statsd import StatsdListener
from tests.system.airflow_standalone import migrate
from tests.system.test_event_listener import AIRFLOW, WAIT, dag_runs, standalone_env, stream_events, wait_for

SLOW = 3.0  # seconds the API server takes to answer for the liftbridge connection (< [workers] execution_api_timeout)
SECRETS = {"password": "Pg-s3cret-8f2a1c", "variable": "Var-s3cret-77b1e0", "registered": "Reg-s3cret-19c4d2"}

BACKENDS = '''
"""Secrets backends of the test: slow in the API server, a gate in the task processes (see the test)."""
import os
import pathlib
import threading
import time

from airflow.secrets import BaseSecretsBackend

CONN_ID = "liftbridge_default"


class SlowConnections(BaseSecretsBackend):
    """The API server's: the liftbridge connection, after LBTEST_SLOW seconds (a far-away secrets store)."""

    def get_conn_value(self, conn_id, team_name=None):
        if conn_id != CONN_ID:
            return None
        time.sleep(float(os.environ["LBTEST_SLOW"]))
        return os.environ["LBTEST_LIFTBRIDGE_CONN"]

    def get_variable(self, key, team_name=None):
        return None


class GatedConnections(BaseSecretsBackend):
    """The task processes': finds nothing, but a lookup of the liftbridge connection made off the main thread
    waits (at most 20 s) until the task has made its first async request; either way it leaves a mark."""

    def get_conn_value(self, conn_id, team_name=None):
        if conn_id == CONN_ID:
            gate, pid = pathlib.Path(os.environ["LBTEST_GATE_DIR"]), os.getpid()
            if threading.current_thread() is not threading.main_thread():
                deadline = time.monotonic() + 20
                while not (gate / f"asend-done-{pid}").exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
            (gate / f"gate-passed-{pid}").touch()
        return None

    def get_variable(self, key, team_name=None):
        return None
'''

DAGS = f'''
import asyncio
import os
import pathlib
from datetime import datetime

from airflow.sdk import DAG, BaseHook, Variable, get_current_context, task
from airflow.sdk.log import mask_secret

with DAG("events_async_task", schedule="@once", start_date=datetime(2026, 1, 1), is_paused_upon_creation=False):

    @task
    async def agent():
        """An async request, then a plain XCom push from the event loop: Airflow allows it when no async
        request is in flight; the listener's lookup, were it beside the task, would be (SLOW seconds)."""
        await BaseHook.aget_connection("probe")
        gate, pid = pathlib.Path(os.environ["LBTEST_GATE_DIR"]), os.getpid()
        (gate / f"asend-done-{{pid}}").touch()
        for _ in range(600):
            if (gate / f"gate-passed-{{pid}}").exists():
                break
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError("the listener never looked its connection up")
        await asyncio.sleep(1)
        get_current_context()["ti"].xcom_push(key="progress", value="half")
        return "done"

    agent()

with DAG("events_secret_in_error", schedule="@once", start_date=datetime(2026, 1, 1), is_paused_upon_creation=False):

    @task(retries=0)
    def leaky():
        uri = BaseHook.get_connection("warehouse_db").get_uri()
        variable = Variable.get("warehouse_password")
        mask_secret({SECRETS["registered"]!r})
        raise RuntimeError(f"login failed for {{uri}} (variable {{variable}}, token {SECRETS["registered"]})")

    leaky()
'''


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`airflow standalone` with both DAGs (@once, unpaused), publishing task events to a fresh stream; yields
    (env, client, stream, home, log) and stops everything after the module."""
    tmp = tmp_path_factory.mktemp("events-tasks")
    node = start_single()
    statsd = StatsdListener()
    statsd.collect_in_background()
    home, stream, gate, modules = tmp / "airflow", f"airflow-events-{uuid.uuid4().hex[:8]}", tmp / "gate", tmp / "py"
    for folder in (home / "dags", gate, modules):
        folder.mkdir(parents=True)
    (home / "dags" / "event_task_dags.py").write_text(DAGS)
    (modules / "lbtest_secrets.py").write_text(BACKENDS)
    env = standalone_env(home, node, stream, statsd)
    env.pop("AIRFLOW_CONN_LIFTBRIDGE_DEFAULT")  # the API server's slow backend answers for it
    env.update({
        "PYTHONPATH": os.pathsep.join(filter(None, [str(modules), env.get("PYTHONPATH")])),
        "AIRFLOW__SECRETS__BACKEND": "lbtest_secrets.SlowConnections",
        "AIRFLOW__WORKERS__SECRETS_BACKEND": "lbtest_secrets.GatedConnections",
        "AIRFLOW__LIFTBRIDGE_EVENTS__EVENTS": "task_instance",  # the scheduler looks nothing up
        "AIRFLOW__LIFTBRIDGE_EVENTS__PUBLISH_TIMEOUT": "5",
        "AIRFLOW__LIFTBRIDGE_EVENTS__FLUSH_TIMEOUT": "30",
        "LBTEST_SLOW": str(SLOW),
        "LBTEST_LIFTBRIDGE_CONN": json.dumps({"conn_type": "liftbridge", "host": node.brokers[0]}),
        "LBTEST_GATE_DIR": str(gate),
        "AIRFLOW_CONN_PROBE": "generic://probe:Probe-pass-5e1f@probe.example",
        "AIRFLOW_CONN_WAREHOUSE_DB": f"postgresql://etl:{SECRETS['password']}@db.example:5432/etl",
        "AIRFLOW_VAR_WAREHOUSE_PASSWORD": SECRETS["variable"],
    })  # fmt: skip
    log = tmp / "standalone.log"
    migrate(env)
    with LiftbridgeClient(node.brokers) as client:
        client.create_stream(stream, stream)
        standalone = subprocess.Popen(
            [AIRFLOW, "standalone"], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield env, client, stream, home, log
        finally:
            end_session(standalone, ("AIRFLOW_HOME", env["AIRFLOW_HOME"]))
            statsd.close()
            node.stop(timeout=5)


def ended_events(client: LiftbridgeClient, stream: str, dag_id: str, log: Path) -> list[dict[str, Any]]:
    """The task events of ``dag_id``'s run, once its task's end event is on the stream."""

    def ended() -> list[dict[str, Any]]:
        events = [e for e in stream_events(client, stream, 1)[0] if e["dag_id"] == dag_id]
        return events if any(e["event"] != "task_instance.running" for e in events) else []

    events: list[dict[str, Any]] = wait_for(ended, f"task end event of {dag_id}", log)
    return events


@pytest.mark.timeout(3 * WAIT + 120)
def test_the_listener_never_fails_an_async_task_that_uses_the_supervisor_channel(standalone: Any) -> None:
    """The async task succeeds, and its events are published: the listener's connection lookup in its
    process never held the task's supervisor channel while the task's event loop used it."""
    env, client, stream, _, log = standalone
    events = ended_events(client, stream, "events_async_task", log)
    steps = [(e["event"], e["state"]) for e in events]
    errors = [e["error"][:300] for e in events if "error" in e]
    assert steps == [("task_instance.running", "running"), ("task_instance.success", "success")], errors
    (run,) = wait_for(
        lambda: [r for r in dag_runs(env, "events_async_task") if r["state"] in ("success", "failed")],
        "finished run of events_async_task",
        log,
    )
    assert run["state"] == "success"


@pytest.mark.timeout(3 * WAIT + 120)
def test_a_failed_task_event_masks_what_the_task_log_masks(standalone: Any) -> None:
    """The task's log (under the scheduler, through Airflow's secrets masker) shows the connection's
    password, the sensitive Variable and the registered value as ***; so does the failed event, which
    carries none of them."""
    _, client, stream, home, log = standalone
    events = ended_events(client, stream, "events_secret_in_error", log)
    (failed,) = [e for e in events if e["event"] == "task_instance.failed"]
    masked = "login failed for postgres://etl:***@db.example:5432/etl (variable ***, token ***)"
    (task_log,) = (home / "logs").glob("dag_id=events_secret_in_error/run_id=*/task_id=leaky/attempt=1.log")
    logged = task_log.read_text()
    assert masked in logged, logged[-3000:]
    assert masked in failed["error"], failed
    published = json.dumps(events)
    for name, secret in SECRETS.items():
        assert secret not in logged, f"the task log shows the {name}: the test would check nothing"
        assert secret not in published, f"the {name} reached the stream: {failed['error']}"
