"""How long a run's frozen ranges are kept in Airflow 3.3's task state store, and what a clear gets after that.

The freeze operator keeps its ranges document in the task state store so that
a retry or clear of the run gets the same ranges. Two things of the store can
take the document away (Airflow 3.3.2, ``airflow/state/metastore.py``,
``airflow/api_fastapi/execution_api/routes/task_instances.py``):

- retention: a row written with the default expiry (``[state_store]
  default_retention_days``, 30) is deleted by ``airflow state-store clean``
  once it expired. Until issue 50 the freeze kept its ranges with that expiry,
  so a clear 31 days later froze new, bigger ranges. Now it keeps them with
  Airflow's ``NEVER_EXPIRE``: the row goes with its DAG run, no sooner.
- ``[state_store] clear_on_success=True``: the API server deletes a task's
  rows when it succeeds, so a clear after a success finds nothing. The user
  asked for that; the freeze freezes anew and says so in the task log, naming
  the setting (docs/airflow.md, "Exactly once").

Real Airflow (`airflow dags test`, `airflow tasks clear`, `airflow tasks test`,
the store's own cleanup command) against a real Liftbridge node.
"""

from __future__ import annotations

from argparse import Namespace
from datetime import datetime, timedelta
from pathlib import Path
from unittest import mock

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.devserver import DevServer
from tests.airflow.airflow_runs import connection_env, rerun_tasks, run_dag, stream_name

FIRST = [{"partition": 0, "start": 0, "end": 10}]
GONE = "but no ranges are kept for it (in the task state store)"


def state_rows(dag_id: str) -> list[tuple[str, str, datetime | None]]:
    """``(task_id, key, expires_at)`` of every task state store row of ``dag_id``."""
    from airflow.models.task_state_store import TaskStateStoreModel  # noqa: PLC0415 - after AIRFLOW_HOME is set
    from airflow.utils.session import create_session  # noqa: PLC0415

    with create_session() as session:
        rows = session.query(TaskStateStoreModel).filter(TaskStateStoreModel.dag_id == dag_id).all()
        return [(row.task_id, row.key, row.expires_at) for row in rows]


def clean_the_state_store(days_later: int) -> None:
    """`airflow state-store clean`, as the command runs it, on a clock ``days_later`` days ahead."""
    from airflow._shared.timezones import timezone  # noqa: PLC0415 - the clock airflow/state/metastore.py reads
    from airflow.cli.commands.state_store_command import clean_state_store  # noqa: PLC0415

    later = timezone.utcnow() + timedelta(days=days_later)
    with mock.patch.object(timezone, "utcnow", return_value=later):
        clean_state_store(Namespace(dry_run=False))


def freeze_dag(stream: str) -> str:
    return f"LiftbridgeOffsetRangesOperator(task_id='freeze', stream={stream!r}, cursor_id='ingest')"


def test_a_clear_after_the_state_stores_retention_gets_the_ranges_the_run_froze(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """The ranges are kept without an expiry: the store's cleanup 31 days later (the default retention is 30)
    leaves them, and a clear of the freeze then gets the ranges the run froze, not bigger ones."""
    stream = stream_name()
    client.create_stream(stream, stream)
    client.publish_batch(stream, [b"before"] * 10, partitioner=None)
    env = connection_env(liftbridge_server)
    run = run_dag(airflow_home, freeze_dag(stream), env)
    assert run.ok(), run.output[-4000:]
    assert run.xcom["freeze"]["ranges"] == FIRST
    client.publish_batch(stream, [b"after"] * 5, partitioner=None)
    clean_the_state_store(days_later=31)
    run = rerun_tasks(run, ["freeze"], env)
    assert run.ok(), run.output[-4000:]
    assert run.xcom["freeze"]["ranges"] == FIRST, "the clear froze new ranges"
    assert "reusing the ranges frozen earlier in this run" in run.output
    assert GONE not in run.output
    assert state_rows(run.dag_id) == [("freeze", "liftbridge_ranges", None)], "kept without an expiry"


def test_with_clear_on_success_a_clear_after_a_success_freezes_anew_and_the_log_says_why(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """``clear_on_success=True`` deletes the ranges when the freeze succeeds; a clear then freezes from the
    cursor again (new messages included) and the task log names the setting. A first try says nothing."""
    stream = stream_name()
    client.create_stream(stream, stream)
    client.publish_batch(stream, [b"before"] * 10, partitioner=None)
    env = {**connection_env(liftbridge_server), "AIRFLOW__STATE_STORE__CLEAR_ON_SUCCESS": "True"}
    run = run_dag(airflow_home, freeze_dag(stream), env)
    assert run.ok(), run.output[-4000:]
    assert run.xcom["freeze"]["ranges"] == FIRST
    assert GONE not in run.output, "a first try has nothing to miss"
    assert state_rows(run.dag_id) == [], "Airflow deleted the task's state when it succeeded"
    client.publish_batch(stream, [b"after"] * 5, partitioner=None)
    run = rerun_tasks(run, ["freeze"], env)
    assert run.ok(), run.output[-4000:]
    assert run.xcom["freeze"]["ranges"] == [{"partition": 0, "start": 0, "end": 15}]
    assert f"{GONE}: [state_store] clear_on_success=True deletes them when the task succeeds" in run.output
