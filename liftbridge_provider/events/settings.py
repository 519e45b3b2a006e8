"""The ``[liftbridge_events]`` options of the event listener: declared once, parsed and checked here.

The declarations feed the provider info's ``config`` (so ``airflow config list``
shows every option with its default and description) and the parser, so the
two never disagree. No Airflow import: the caller hands in a getter. The
description of ``publish_timeout`` and the others are the documentation users
see; docs/airflow.md repeats them in a table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from liftbridge_provider.core.checks import check_stream_name
from liftbridge_provider.core.errors import InvalidArgumentError

SECTION = "liftbridge_events"

DAG_RUN_EVENTS = ("dag_run.running", "dag_run.success", "dag_run.failed")
TASK_INSTANCE_EVENTS = (
    "task_instance.running",
    "task_instance.success",
    "task_instance.failed",
    "task_instance.skipped",
)
EVENT_KINDS = DAG_RUN_EVENTS + TASK_INSTANCE_EVENTS
EVENT_GROUPS = {"dag_run": DAG_RUN_EVENTS, "task_instance": TASK_INSTANCE_EVENTS}

OptionType = Literal["string", "boolean", "integer", "float"]


@dataclass(frozen=True, kw_only=True)
class Option:
    """One option of the section: its name, type, default (as Airflow's config holds it: text) and help."""

    name: str
    type: OptionType
    default: str
    description: str
    example: str | None = None


OPTIONS = (
    Option(
        name="enabled",
        type="boolean",
        default="False",
        description="Publish Airflow's DAG-run and task-instance state changes as JSON to a Liftbridge stream. "
        "Read when each Airflow process starts (scheduler, API server, task processes): restart them after "
        "a change. Publishing never blocks or fails the scheduler or a task: events wait in a bounded queue "
        "and a background thread publishes them; what cannot be published is dropped, counted in the "
        "metric liftbridge.events.dropped and logged.",
    ),
    Option(
        name="conn_id",
        type="string",
        default="liftbridge_default",
        description="The liftbridge connection to publish through (brokers, TLS). Every Airflow process that "
        "publishes reads it: the scheduler, the API server and the task processes.",
    ),
    Option(
        name="stream",
        type="string",
        default="airflow-events",
        description="The stream the events go to. Create it first (it is never created by the listener); "
        "its partition count is up to you: every event of one DAG run has the key '<dag_id>/<run_id>' and so "
        "goes to the same partition, in order.",
    ),
    Option(
        name="events",
        type="string",
        default="dag_run,task_instance",
        description="Which events to publish, comma separated: dag_run (all three of it), task_instance (all "
        "four), or single ones: " + ", ".join(EVENT_KINDS) + ".",
        example="dag_run.success,dag_run.failed,task_instance.failed",
    ),
    Option(
        name="queue_size",
        type="integer",
        default="10000",
        description="Events each process holds while they wait to be published. An event that finds the "
        "queue full is dropped (counted and logged), never waited for.",
    ),
    Option(
        name="publish_timeout",
        type="float",
        default="5.0",
        description="Seconds each step of one event's publish may take (the stream's metadata, then the "
        "message and the leader's ack); an event whose publish fails or takes longer is dropped.",
    ),
    Option(
        name="retry_interval",
        type="float",
        default="10.0",
        description="Seconds the publisher rests after a failed publish (Liftbridge down, stream missing) "
        "before it tries the next event; events keep queueing meanwhile, up to queue_size.",
    ),
    Option(
        name="flush_timeout",
        type="float",
        default="5.0",
        description="Seconds a process that stops (a task process when its task ends, the scheduler at "
        "shutdown) waits for its queued events to be published; what is still queued then is dropped.",
    ),
    Option(
        name="dag_run_end_delay",
        type="float",
        default="2.0",
        description="Seconds a DAG run's success or failed event waits before it is published. Airflow "
        "records a task's end before it tells the task's listeners, so without the wait the scheduler's "
        "event for the run's end can reach the stream just before the last task's own end event. 0 publishes "
        "at once.",
    ),
)
DEFAULTS = {option.name: option.default for option in OPTIONS}


@dataclass(frozen=True, kw_only=True)
class EventSettings:
    """The listener's settings, checked; see :data:`OPTIONS` for what each means (seconds for the times)."""

    enabled: bool = False
    conn_id: str = "liftbridge_default"
    stream: str = "airflow-events"
    events: frozenset[str] = frozenset(EVENT_KINDS)
    queue_size: int = 10_000
    publish_timeout: float = 5.0
    retry_interval: float = 10.0
    flush_timeout: float = 5.0
    dag_run_end_delay: float = 2.0

    @classmethod
    def from_options(cls, get: Callable[[str], str | None]) -> EventSettings:
        """Settings from ``get(option)`` (the option's text, None when unset: its default). A bad value
        raises ValueError naming the option, the value and what is allowed."""

        def text(name: str) -> str:
            value = get(name)
            return (DEFAULTS[name] if value is None else str(value)).strip()

        return cls(
            enabled=_boolean(text("enabled"), "enabled"),
            conn_id=_name(text("conn_id"), "conn_id"),
            stream=_stream(text("stream")),
            events=_events(text("events")),
            queue_size=_integer(text("queue_size"), "queue_size"),
            publish_timeout=_seconds(text("publish_timeout"), "publish_timeout", zero_ok=False),
            retry_interval=_seconds(text("retry_interval"), "retry_interval", zero_ok=True),
            flush_timeout=_seconds(text("flush_timeout"), "flush_timeout", zero_ok=True),
            dag_run_end_delay=_seconds(text("dag_run_end_delay"), "dag_run_end_delay", zero_ok=True),
        )


def provider_config() -> dict[str, Any]:
    """The provider info's ``config`` entry for the section."""
    options = {
        o.name: {
            "description": o.description,
            "version_added": None,
            "type": o.type,
            "example": o.example,
            "default": o.default,
        }
        for o in OPTIONS
    }
    description = "Publishing Airflow's DAG-run and task-instance events to a Liftbridge stream (the listener plugin)."
    return {SECTION: {"description": description, "options": options}}


def _where(name: str) -> str:
    return f"[{SECTION}] {name}"


def _boolean(value: str, name: str) -> bool:
    lowered = value.lower()
    if lowered in ("true", "t", "1", "yes", "on"):
        return True
    if lowered in ("false", "f", "0", "no", "off", ""):
        return False
    raise ValueError(f"{_where(name)} must be True or False, got {value!r}")


def _name(value: str, name: str) -> str:
    if not value:
        raise ValueError(f"{_where(name)} must not be empty")
    return value


def _stream(value: str) -> str:
    try:
        return check_stream_name(_name(value, "stream"))
    except InvalidArgumentError as exc:
        raise ValueError(f"{_where('stream')}: {exc.message}") from exc


def _integer(value: str, name: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"{_where(name)} must be a whole number >= 1, got {value!r}")
    return number


def _seconds(value: str, name: str, *, zero_ok: bool) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0 or (number == 0 and not zero_ok):
        allowed = "a number of seconds >= 0" if zero_ok else "a number of seconds > 0"
        raise ValueError(f"{_where(name)} must be {allowed}, got {value!r}")
    return number


def _events(value: str) -> frozenset[str]:
    chosen: set[str] = set()
    for item in (part.strip() for part in value.split(",")):
        if item in EVENT_GROUPS:
            chosen.update(EVENT_GROUPS[item])
        elif item in EVENT_KINDS:
            chosen.add(item)
        elif item:
            allowed = ", ".join((*EVENT_GROUPS, *EVENT_KINDS))
            raise ValueError(f"{_where('events')}: unknown event {item!r}; allowed: {allowed}")
    if not chosen:
        raise ValueError(f"{_where('events')} names no event (disable the listener with enabled = False instead)")
    return frozenset(chosen)
