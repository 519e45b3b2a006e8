"""The ingest runs Airflow recorded, for the Liftbridge page's Runs view: read from its metadata DB.

An ingest run is a task instance whose rendered template fields hold the ingest job's command line
(``runs.ingest_call``): Airflow keeps them per task instance (``rendered_task_instance_fields``, the newest
``[core] max_num_rendered_ti_fields_per_task`` of each task, 30 by default). The newest
:data:`SCANNED_TASKS` rendered task instances are looked at, newest first, and the first ``limit`` ingest
calls among them kept. When a call's ranges are not in its arguments (``@path``, or the arguments cut short
by ``[core] max_templated_field_length``), they are taken from the run's ``LiftbridgeOffsetRangesOperator``
XCom (the freeze). The ``aws`` connection of a lake on S3 is the run's conf ``aws_conn_id``, else
``aws_default``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from liftbridge_provider.ui.runs import IngestCall, RunRecord, ingest_call, parse_ranges

SCANNED_TASKS = 500
"""Rendered task instances looked at per answer (newest first), to find the last runs among them."""
FREEZE_OPERATOR = "LiftbridgeOffsetRangesOperator"


def _iso(value: Any) -> str | None:
    return value.isoformat(timespec="seconds") if value is not None else None


def _freeze_ranges(session: Any, dag_id: str, run_id: str) -> Any:
    from airflow.models.taskinstance import TaskInstance  # noqa: PLC0415
    from airflow.models.xcom import XComModel  # noqa: PLC0415

    rows = session.scalars(
        select(XComModel)
        .join(
            TaskInstance,
            (TaskInstance.dag_id == XComModel.dag_id)
            & (TaskInstance.run_id == XComModel.run_id)
            & (TaskInstance.task_id == XComModel.task_id),
        )
        .where(
            XComModel.dag_id == dag_id,
            XComModel.run_id == run_id,
            XComModel.key == "return_value",
            TaskInstance.operator == FREEZE_OPERATOR,
        )
    ).all()
    for row in rows:
        value = XComModel.deserialize_value(row)
        found = parse_ranges(value if isinstance(value, str) else _json(value))
        if found is not None:
            return found
    return None


def _text(state: Any) -> str | None:
    return None if state is None else str(getattr(state, "value", state))


def _json(value: Any) -> str | None:
    import json  # noqa: PLC0415

    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return None


def ingest_runs(limit: int) -> list[tuple[RunRecord, str | None]]:
    """The newest ``limit`` ingest task instances (newest DAG run first), each with the name of the ``aws``
    connection its lake is read with."""
    from airflow.models.dagrun import DagRun  # noqa: PLC0415
    from airflow.models.renderedtifields import RenderedTaskInstanceFields as Rendered  # noqa: PLC0415
    from airflow.models.taskinstance import TaskInstance  # noqa: PLC0415
    from airflow.utils.session import create_session  # noqa: PLC0415

    found: list[tuple[RunRecord, str | None]] = []
    with create_session() as session:
        query = (
            select(Rendered, TaskInstance, DagRun)
            .join(
                TaskInstance,
                (TaskInstance.dag_id == Rendered.dag_id)
                & (TaskInstance.run_id == Rendered.run_id)
                & (TaskInstance.task_id == Rendered.task_id)
                & (TaskInstance.map_index == Rendered.map_index),
            )
            .join(DagRun, (DagRun.dag_id == Rendered.dag_id) & (DagRun.run_id == Rendered.run_id))
            .order_by(DagRun.id.desc(), TaskInstance.start_date.desc())
            .limit(SCANNED_TASKS)
        )
        for rendered, ti, run in session.execute(query).all():
            call = ingest_call(rendered.rendered_fields or {})
            if call is None:
                continue
            if call.ranges is None:
                call = IngestCall(call.output, call.lake_format, _freeze_ranges(session, run.dag_id, run.run_id))
            conf = run.conf if isinstance(run.conf, dict) else {}
            record = RunRecord(
                dag_id=run.dag_id,
                run_id=run.run_id,
                task_id=ti.task_id,
                state=_text(ti.state),
                run_state=_text(run.state),
                started=_iso(ti.start_date),
                ended=_iso(ti.end_date),
                call=call,
            )
            found.append((record, str(conf.get("aws_conn_id") or "aws_default")))
            if len(found) >= limit:
                break
    return found
