"""One Airflow state change as the JSON event the listener publishes, and the key that keeps a run in order.

An event is a flat JSON object (``SCHEMA_VERSION`` 1)::

    {"schema_version": 1, "event": "task_instance.success", "state": "success",
     "dag_id": "ingest", "run_id": "manual__2026-11-26T10:00:00+00:00",
     "task_id": "load", "map_index": -1, "try_number": 1,
     "start_date": "2026-11-26T10:00:01.5+00:00", "end_date": "2026-11-26T10:00:09.1+00:00",
     "emitted_at": "2026-11-26T10:00:09.2+00:00", "host": "worker-1", "pid": 4242}

DAG-run events have ``run_type``, ``logical_date`` and ``msg`` (Airflow's reason,
e.g. ``task_failure``) instead of the task fields; failed task events add
``error``. Times are ISO 8601 in UTC, null when Airflow has none. The objects
are read by attribute only (Airflow hands in ORM rows in the scheduler and API
server, runtime models in task processes), never through relationships, so
building an event runs no query.

Before an event leaves the process it goes through :func:`masked`: every text
value through Airflow's secrets masker (the listener hands in its ``redact``),
so an event shows ``***`` wherever the task's log would, and then the error is
cut to :data:`ERROR_CHARS` characters. No Airflow import here.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from enum import Enum
from typing import Any

SCHEMA_VERSION = 1
ERROR_CHARS = 2000  # a failed task's error text is cut to this many characters (after masking)


def event_key(dag_id: str, run_id: str) -> bytes:
    """The message key of every event of one DAG run: ``<dag_id>/<run_id>``, so they share a partition."""
    return f"{dag_id}/{run_id}".encode()


def dag_run_event(kind: str, dag_run: Any, *, msg: str | None) -> dict[str, Any]:
    """The event of a DAG run's state change (``kind``: ``dag_run.running``, ``.success`` or ``.failed``)."""
    return {
        **_head(kind, _state(dag_run, kind)),
        "dag_id": dag_run.dag_id,
        "run_id": dag_run.run_id,
        "run_type": _text(getattr(dag_run, "run_type", None)),
        "logical_date": _time(getattr(dag_run, "logical_date", None)),
        "start_date": _time(getattr(dag_run, "start_date", None)),
        "end_date": _time(getattr(dag_run, "end_date", None)),
        "msg": msg or None,
        **_source(),
    }


def task_instance_event(kind: str, task_instance: Any, *, error: object = None) -> dict[str, Any]:
    """The event of a task instance's state change (``kind``: ``task_instance.running``, ``.success``,
    ``.failed`` (its ``state`` says ``up_for_retry`` when a retry follows) or ``.skipped``). The error is
    whole here: :func:`masked` cuts it once the masker has seen all of it."""
    event = {
        **_head(kind, _state(task_instance, kind)),
        "dag_id": task_instance.dag_id,
        "run_id": task_instance.run_id,
        "task_id": task_instance.task_id,
        "map_index": getattr(task_instance, "map_index", -1),
        "try_number": getattr(task_instance, "try_number", None),
        "start_date": _time(getattr(task_instance, "start_date", None)),
        "end_date": _time(getattr(task_instance, "end_date", None)),
        **_source(),
    }
    if error is not None:
        event["error"] = str(error)
    return event


def masked(event: dict[str, Any], redact: Callable[[str], object]) -> dict[str, Any]:
    """The event as it may leave the process: every text value passed through ``redact`` (Airflow's secrets
    masker: the values it knows become ``***``), then ``error`` cut to :data:`ERROR_CHARS` characters.

    Masking comes first: a cut through a secret would leave its start, which the masker (it looks for the
    whole value) no longer finds."""
    out = {name: str(redact(value)) if isinstance(value, str) else value for name, value in event.items()}
    if isinstance(out.get("error"), str):
        out["error"] = out["error"][:ERROR_CHARS]
    return out


def encode(event: dict[str, Any]) -> bytes:
    """The event as compact UTF-8 JSON (values JSON cannot hold become text)."""
    return json.dumps(event, separators=(",", ":"), default=str).encode()


def _head(kind: str, state: str) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "event": kind, "state": state}


def _state(thing: Any, kind: str) -> str:
    """Airflow's state of the object when it holds one that fits the event, else the event's own."""
    said = kind.rsplit(".", 1)[1]
    state = _text(getattr(thing, "state", None))
    fitting = ("failed", "up_for_retry") if said == "failed" else (said,)
    return state if state is not None and state in fitting else said


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return str(value.value) if isinstance(value, Enum) else str(value)


def _time(value: Any) -> str | None:
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC).isoformat()
    return None if value is None else str(value)


def _source() -> dict[str, Any]:
    return {"emitted_at": datetime.now(UTC).isoformat(), "host": socket.gethostname(), "pid": os.getpid()}
