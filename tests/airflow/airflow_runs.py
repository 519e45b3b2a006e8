"""Run DAGs with the real Airflow CLI and read back what they left: the helpers the Airflow integration tests share.

``run_dag`` writes a DAG file into Airflow's home (its ``dags`` folder; the home and its
SQLite metadata DB come from the ``airflow_home`` fixture of tests/conftest.py), runs
`airflow dags test` on it (in a process forked from a warm one, tests/airflow/warm_cli.py)
and returns a :class:`DagRun` with the CLI's output and the run's XComs, task states and
try numbers from the metadata DB. ``rerun_tasks`` clears tasks of such a run and runs them
again in the same run, as a user's clear does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

from liftbridge_provider.devserver import DevServer
from tests.airflow.warm_cli import run_airflow

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
IMPORTS = """
from airflow.sdk import DAG, task
from liftbridge_provider.operators.streams import (
    LiftbridgeCreateStreamOperator, LiftbridgeDeleteStreamOperator,
    LiftbridgePauseStreamOperator, LiftbridgeSetStreamReadonlyOperator,
)
from liftbridge_provider.operators.publish import LiftbridgePublishOperator
from liftbridge_provider.operators.ranges import LiftbridgeOffsetRangesOperator, LiftbridgeCommitCursorOperator
from liftbridge_provider.operators.consume import LiftbridgeConsumeOperator
from liftbridge_provider.sensors.offset import LiftbridgePartitionOffsetSensor
from liftbridge_provider.sensors.lag import LiftbridgeCursorLagSensor
from liftbridge_provider.sensors.message import LiftbridgeMessageSensor
"""


MARKED_SENSORS = '''
"""Sensors that create the file ``marker`` names when they defer: their own check found nothing yet."""
from liftbridge_provider.sensors.message import LiftbridgeMessageSensor
from liftbridge_provider.sensors.offset import LiftbridgePartitionOffsetSensor


def _marked(sensor):
    class Marked(sensor):  # a direct subclass: Airflow wraps each operator class's __init__
        def __init__(self, *, marker, **kwargs):
            super().__init__(**kwargs)
            self.marker = marker

        def defer(self, *args, **kwargs):
            open(self.marker, "w").close()
            super().defer(*args, **kwargs)

    return Marked


MarkedOffsetSensor = _marked(LiftbridgePartitionOffsetSensor)
MarkedMessageSensor = _marked(LiftbridgeMessageSensor)
'''


def write_marked_sensors(home: Path) -> None:
    """Put ``marked_sensors`` in the DAGs folder. A test that publishes once the marker exists publishes after
    the sensor checked and deferred, however slowly the run started; a sensor that never defers writes none."""
    (home / "dags" / "marked_sensors.py").write_text(MARKED_SENSORS)


def connection_env(server: DevServer, **extra: Any) -> dict[str, str]:
    connection = {"conn_type": "liftbridge", "host": ",".join(server.brokers), "extra": extra}
    return {"AIRFLOW_CONN_LIFTBRIDGE_DEFAULT": json.dumps(connection)}


class DagRun:
    """What `airflow dags test` printed, and what its run left in the metadata DB."""

    def __init__(self, dag_id: str, result: subprocess.CompletedProcess[str]) -> None:
        self.dag_id = dag_id
        self.returncode = result.returncode
        self.output = result.stdout + result.stderr
        self.run_id, self.xcom, self.states, self.tries = _run_records(dag_id)

    def ok(self) -> bool:
        return self.returncode == 0 and set(self.states.values()) <= {"success", "skipped"}


def _run_records(dag_id: str) -> tuple[str | None, dict[str, Any], dict[str, str], dict[str, int]]:
    """Run id, XCom return values, task states and try numbers of the latest run of ``dag_id``."""
    from airflow.models.dagrun import DagRun as DagRunModel  # noqa: PLC0415 - after AIRFLOW_HOME is set
    from airflow.models.xcom import XComModel  # noqa: PLC0415
    from airflow.utils.session import create_session  # noqa: PLC0415

    with create_session() as session:
        run = session.query(DagRunModel).filter(DagRunModel.dag_id == dag_id).order_by(DagRunModel.id.desc()).first()
        if run is None:
            return None, {}, {}, {}
        xcoms = session.query(XComModel).filter(XComModel.dag_id == dag_id, XComModel.run_id == run.run_id).all()
        states = {ti.task_id: str(ti.state) for ti in run.task_instances}
        tries = {ti.task_id: ti.try_number for ti in run.task_instances}
        return run.run_id, {x.task_id: x.value for x in xcoms if x.key == "return_value"}, states, tries


def run_dag(home: Path, body: str, env: dict[str, str], dag_id: str | None = None) -> DagRun:
    """Write a DAG file (``body`` goes inside ``with DAG(...)``) and run it with `airflow dags test`."""
    dag_id = dag_id or f"lbtest_{uuid.uuid4().hex[:8]}"
    source = IMPORTS + f"\nwith DAG({dag_id!r}, schedule=None):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    (home / "dags" / f"{dag_id}.py").write_text(source)
    result = run_airflow(["dags", "test", dag_id], {**os.environ, **env}, timeout=300)
    return DagRun(dag_id, result)


def stream_name() -> str:
    return f"af-{uuid.uuid4().hex[:8]}"


def rerun_tasks(run: DagRun, task_ids: list[str], env: dict[str, str]) -> DagRun:
    """Clear ``task_ids`` of ``run`` with `airflow tasks clear`, then run them again, in order, in the same run.

    Each cleared task counts a new try first, as the scheduler does when it schedules a cleared task
    (``DagRun.schedule_tis``: ``try_number + 1``); `airflow tasks test` runs a task without counting one."""
    command = [AIRFLOW, "tasks", "clear", run.dag_id, "-t", f"^({'|'.join(task_ids)})$", "-y"]
    outputs = [_airflow(command, env)]
    assert run.run_id is not None
    _count_a_try(run.dag_id, run.run_id, task_ids)
    for task_id in task_ids:
        outputs.append(_airflow([AIRFLOW, "tasks", "test", run.dag_id, task_id, run.run_id], env))
    result = subprocess.CompletedProcess(command, 0, "".join(outputs), "")
    return DagRun(run.dag_id, result)


def _airflow(command: list[str], env: dict[str, str]) -> str:
    done = run_airflow(command[1:], {**os.environ, **env}, timeout=300)
    return done.stdout + done.stderr


def _count_a_try(dag_id: str, run_id: str, task_ids: list[str]) -> None:
    from airflow.models.taskinstance import TaskInstance  # noqa: PLC0415 - after AIRFLOW_HOME is set
    from airflow.utils.session import create_session  # noqa: PLC0415
    from sqlalchemy import update  # noqa: PLC0415

    with create_session() as session:
        session.execute(
            update(TaskInstance)
            .where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.task_id.in_(task_ids))
            .values(try_number=TaskInstance.try_number + 1)
        )
