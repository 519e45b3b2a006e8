"""The event listener's options, events and provider info, without servers."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import Enum
from types import SimpleNamespace

import pytest

from liftbridge_provider.events.payloads import (
    ERROR_CHARS,
    dag_run_event,
    encode,
    event_key,
    masked,
    task_instance_event,
)
from liftbridge_provider.events.settings import DEFAULTS, EVENT_KINDS, OPTIONS, SECTION, EventSettings
from liftbridge_provider.get_provider_info import get_provider_info


def settings(**options: str) -> EventSettings:
    return EventSettings.from_options(options.get)


def test_unset_options_are_the_declared_defaults_and_the_dataclass_defaults_agree() -> None:
    """What `airflow config list` shows as a default is what the listener runs with."""
    assert settings() == EventSettings()
    assert not settings().enabled


def test_provider_info_declares_every_option_with_its_default_and_description() -> None:
    config = get_provider_info()["config"][SECTION]
    assert set(config["options"]) == {o.name for o in OPTIONS}
    for name, option in config["options"].items():
        assert option["default"] == DEFAULTS[name]
        assert option["description"]
        assert option["type"] in ("string", "boolean", "integer", "float")
    assert get_provider_info()["plugins"] == [
        {"name": "liftbridge_events", "plugin-class": "liftbridge_provider.events.plugin.LiftbridgeEventsPlugin"},
        {"name": "liftbridge_ui", "plugin-class": "liftbridge_provider.ui.plugin.LiftbridgeUiPlugin"},
    ]


def test_options_are_read() -> None:
    chosen = settings(
        enabled="True",
        conn_id="lb",
        stream="airflow.events",
        events="dag_run, task_instance.failed",
        queue_size="7",
        publish_timeout="0.5",
        retry_interval="0",
        flush_timeout="0",
        dag_run_end_delay="0",
    )
    assert chosen == EventSettings(
        enabled=True,
        conn_id="lb",
        stream="airflow.events",
        events=frozenset({"dag_run.running", "dag_run.success", "dag_run.failed", "task_instance.failed"}),
        queue_size=7,
        publish_timeout=0.5,
        retry_interval=0.0,
        flush_timeout=0.0,
        dag_run_end_delay=0.0,
    )
    assert settings(events="task_instance").events == {e for e in EVENT_KINDS if e.startswith("task_instance.")}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"enabled": "maybe"}, "[liftbridge_events] enabled must be True or False, got 'maybe'"),
        ({"stream": ""}, "[liftbridge_events] stream must not be empty"),
        ({"stream": "a b"}, "[liftbridge_events] stream: "),
        ({"conn_id": " "}, "[liftbridge_events] conn_id must not be empty"),
        ({"events": "dag_run.started"}, "unknown event 'dag_run.started'; allowed: dag_run, task_instance, "),
        ({"events": " , "}, "[liftbridge_events] events names no event"),
        ({"queue_size": "0"}, "[liftbridge_events] queue_size must be a whole number >= 1, got '0'"),
        ({"queue_size": "many"}, "[liftbridge_events] queue_size must be a whole number >= 1, got 'many'"),
        ({"publish_timeout": "0"}, "[liftbridge_events] publish_timeout must be a number of seconds > 0, got '0'"),
        ({"flush_timeout": "-1"}, "[liftbridge_events] flush_timeout must be a number of seconds >= 0, got '-1'"),
        ({"retry_interval": "nan"}, "[liftbridge_events] retry_interval must be a number of seconds >= 0"),
        ({"dag_run_end_delay": "soon"}, "[liftbridge_events] dag_run_end_delay must be a number of seconds >= 0"),
    ],
)
def test_bad_options_are_refused_naming_the_option_and_what_is_allowed(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=r"^\[liftbridge_events\] ") as refused:
        settings(**options)
    assert message in str(refused.value)


class State(Enum):
    UP_FOR_RETRY = "up_for_retry"
    RUNNING = "running"


def test_a_failed_task_event_says_whether_a_retry_follows_and_carries_the_error() -> None:
    start = datetime(2026, 11, 26, 10, 0, 1, tzinfo=UTC)
    ti = SimpleNamespace(
        dag_id="d", run_id="r", task_id="t", map_index=3, try_number=2, state=State.UP_FOR_RETRY,
        start_date=start, end_date=None,
    )  # fmt: skip
    event = task_instance_event("task_instance.failed", ti, error=ValueError("x" * 5000))
    assert {k: event[k] for k in ("event", "state", "dag_id", "run_id", "task_id", "map_index", "try_number")} == {
        "event": "task_instance.failed",
        "state": "up_for_retry",
        "dag_id": "d",
        "run_id": "r",
        "task_id": "t",
        "map_index": 3,
        "try_number": 2,
    }
    assert event["start_date"] == "2026-11-26T10:00:01+00:00"
    assert event["end_date"] is None
    assert masked(event, str)["error"] == "x" * 2000
    assert {"emitted_at", "host", "pid", "schema_version"} <= set(event)


def test_every_text_value_is_masked_and_the_error_is_cut_only_after() -> None:
    """A secret that the cut at ERROR_CHARS would split is masked whole first, so no start of it remains;
    every other text value goes through the masker too, and values that are not text are left alone."""
    secret = "Pg-s3cret-8f2a1c"
    error = "x" * (ERROR_CHARS - 5) + secret + " y"
    ti = SimpleNamespace(dag_id="d", run_id=f"r-{secret}", task_id="t", try_number=1)
    event = task_instance_event("task_instance.failed", ti, error=RuntimeError(error))
    out = masked(event, lambda text: text.replace(secret, "***"))
    assert out["error"] == "x" * (ERROR_CHARS - 5) + "*** y"
    assert out["run_id"] == "r-***"
    assert (out["try_number"], out["map_index"]) == (1, -1)
    assert secret[:5] not in encode(out).decode()


def test_an_event_whose_object_holds_another_state_says_the_events_own() -> None:
    """Airflow may not have updated the object's state yet when it calls the hook: the event's kind wins."""
    ti = SimpleNamespace(dag_id="d", run_id="r", task_id="t", state=State.RUNNING)
    assert task_instance_event("task_instance.success", ti)["state"] == "success"
    assert task_instance_event("task_instance.failed", ti)["state"] == "failed"


def test_dag_run_events_and_their_key() -> None:
    run = SimpleNamespace(
        dag_id="d", run_id="r", run_type="manual", state="success", logical_date=None,
        start_date=datetime(2026, 11, 26, 10, 0), end_date=datetime(2026, 11, 26, 11, 0, tzinfo=UTC),
    )  # fmt: skip
    event = dag_run_event("dag_run.success", run, msg="success")
    assert (event["state"], event["run_type"], event["msg"]) == ("success", "manual", "success")
    assert event["start_date"] == "2026-11-26T10:00:00+00:00", "a naive time is taken as UTC"
    assert event["logical_date"] is None
    assert "task_id" not in event
    assert event_key("d", "r") == b"d/r"
    assert encode(event).startswith(b'{"schema_version":1,"event":"dag_run.success"')
