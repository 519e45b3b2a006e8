"""Bad input to the Airflow faces is refused before anything is sent."""

from __future__ import annotations

from typing import Any

import pytest

from liftbridge_provider.client import InvalidArgumentError, PublishMessage
from liftbridge_provider.operators.publish import record_to_message
from liftbridge_provider.triggers.offset import LiftbridgeOffsetTrigger


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"targets": {0: -1}}, "target offset of partition 0 must be a whole number >= 0, got -1"),
        ({"targets": {"-2": 5}}, "target partition must be a whole number >= 0, got -2"),
        ({"targets": {0: 1.5}}, "target offset of partition 0 must be a whole number >= 0, got 1.5"),
        ({"targets": {0: 1}, "poll_interval": -1}, "poll_interval must be a number of seconds > 0, got -1"),
        ({"targets": {0: 1}, "poll_interval": 0}, "poll_interval must be a number of seconds > 0, got 0"),
        ({"targets": {0: 1}, "timeout": -5}, "timeout must be None or a number of seconds > 0, got -5"),
        # an infinite poll interval slept forever, past the trigger's own timeout
        ({"targets": {0: 1}, "poll_interval": float("inf")}, "poll_interval must be a number of seconds > 0"),
        ({"targets": {0: 1}, "timeout": float("inf")}, "timeout must be None or a number of seconds > 0"),
        ({"targets": {0: 1}, "poll_interval": "5"}, "poll_interval must be a number of seconds > 0"),
        ({"targets": {0: 1}, "poll_interval": 1e-9}, r"poll_interval must be at least 0\.1 seconds"),
    ],
)
def test_offset_trigger_refuses_negative_targets_and_intervals(kwargs: dict[str, Any], message: str) -> None:
    """LiftbridgeOffsetTrigger accepted negative targets and poll intervals."""
    with pytest.raises(InvalidArgumentError, match=message):
        LiftbridgeOffsetTrigger(stream="s", **kwargs)


@pytest.mark.parametrize("record", [42, 4.5, True, None, [1, 2], object()])
def test_records_that_are_not_bytes_str_or_mappings_are_refused(record: Any) -> None:
    """An int record was published as b"42"."""
    refused = f"record must be bytes, str or a mapping, got {type(record).__name__}"
    with pytest.raises(InvalidArgumentError, match=refused):
        record_to_message(record)


def test_mapping_fields_may_still_be_numbers() -> None:
    record = {"id": 7, "amount": 2.5}
    assert record_to_message(record, key_field="id", value_field="amount") == PublishMessage(value=b"2.5", key=b"7")


def _consume(**kwargs: Any) -> Any:
    from liftbridge_provider.operators.consume import LiftbridgeConsumeOperator  # noqa: PLC0415

    options: dict[str, Any] = {"task_id": "consume", "stream": "s", "cursor_id": "c", "apply_function": print}
    return LiftbridgeConsumeOperator(**{**options, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"apply_function": None}, "give exactly one of apply_function or apply_function_batch"),
        ({"apply_function_batch": print}, "give exactly one of apply_function or apply_function_batch"),
        ({"commit_cadence": "always"}, "commit_cadence must be one of end_of_operator, end_of_batch, never"),
        ({"cursor_id": None, "start": "earliest"}, "commit_cadence='end_of_operator' needs a cursor_id"),
        ({"max_messages": -1}, "max_messages must be a whole number >= 0, got -1"),
        ({"max_batch_size": 0}, "max_batch_size must be a whole number >= 1, got 0"),
        ({"max_results": True}, "max_results must be a whole number >= 0, got True"),
        ({"start_time": "2026-01-01T00:00:00+00:00", "max_messages_per_partition": 5}, "would cut an interval"),
    ],
)
def test_consume_operator_refuses_bad_settings_when_the_dag_is_parsed(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _consume(**kwargs)


def test_consume_operator_keeps_callables_out_of_its_template_fields() -> None:
    operator = _consume(apply_function_kwargs={"log": "{{ ds }}"})
    assert "apply_function" not in operator.template_fields
    assert "apply_function_batch" not in operator.template_fields
    assert "apply_function_kwargs" in operator.template_fields


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"apply_function": print, "deferrable": True}, "a deferrable sensor needs apply_function as a dotted path"),
        ({"apply_function": 5}, "apply_function must be a callable or a dotted path"),
        ({"start": "earliest"}, "start must be 'latest', 'cursor' or"),
        ({"start": "cursor"}, "start='cursor' and commit_cursor need a cursor_id"),
        ({"commit_cursor": True}, "start='cursor' and commit_cursor need a cursor_id"),
    ],
)
def test_message_sensor_refuses_bad_settings_when_the_dag_is_parsed(kwargs: dict[str, Any], message: str) -> None:
    from liftbridge_provider.sensors.message import LiftbridgeMessageSensor  # noqa: PLC0415

    options: dict[str, Any] = {"task_id": "wait", "stream": "s", "apply_function": "m.f", "deferrable": False}
    with pytest.raises(ValueError, match=message):
        LiftbridgeMessageSensor(**{**options, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"apply_function": print}, "apply_function must be a dotted path"),
        ({"start_offsets": {}}, "start_offsets must name at least one partition"),
        ({"start_offsets": {0: -1}}, "start_offsets offset of partition 0 must be a whole number >= 0"),
        ({"timeout": 0}, "timeout must be None or a number of seconds > 0, got 0"),
    ],
)
def test_await_message_trigger_refuses_bad_values(kwargs: dict[str, Any], message: str) -> None:
    from liftbridge_provider.triggers.await_message import LiftbridgeAwaitMessageTrigger  # noqa: PLC0415

    options: dict[str, Any] = {"stream": "s", "start_offsets": {0: 0}, "apply_function": "m.f"}
    with pytest.raises(InvalidArgumentError, match=message):
        LiftbridgeAwaitMessageTrigger(**{**options, **kwargs})


@pytest.mark.parametrize(("value", "expected"), [(5, 5), ("7", 7), (" 0 ", 0)])
def test_cursor_lag_sensor_reads_max_lag_given_or_rendered(value: object, expected: int) -> None:

    from liftbridge_provider.sensors.lag import LiftbridgeCursorLagSensor  # noqa: PLC0415 - Airflow reads its home

    sensor = LiftbridgeCursorLagSensor(task_id="lag", stream="s", cursor_id="c", max_lag=value)  # type: ignore[arg-type]
    assert sensor._max_lag() == expected


@pytest.mark.parametrize("value", ["²", "-1", "1.5", -1, True, None])
def test_cursor_lag_sensor_refuses_a_max_lag_that_is_not_whole(value: object) -> None:
    """A rendered "²" passed str.isdigit() and int() then raised a bare ValueError, which Airflow retried."""

    from liftbridge_provider.sensors.lag import LiftbridgeCursorLagSensor  # noqa: PLC0415 - Airflow reads its home

    sensor = LiftbridgeCursorLagSensor(task_id="lag", stream="s", cursor_id="c", max_lag=value)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="max_lag must be a whole number of offsets >= 0"):
        sensor._max_lag()


def test_publish_operator_refuses_one_record_given_as_a_mapping() -> None:
    """messages={"user": "u1", "amount": 5} (one record, say an upstream XCom) was iterated as a mapping: its
    keys "user" and "amount" went out as two messages. It is refused, naming what to give instead."""
    from liftbridge_provider.operators.publish import LiftbridgePublishOperator  # noqa: PLC0415

    operator = LiftbridgePublishOperator(task_id="p", stream="s", messages={"user": "u1", "amount": 5})
    with pytest.raises(InvalidArgumentError, match=r"not a single record \(a mapping with keys \[.amount., .user.\]\)"):
        list(operator._records())


def test_deferrable_offset_sensor_times_out_as_a_sensor_timeout_like_poke_mode() -> None:
    """The trigger's timeout came back as a plain AirflowException: the task was retried, each retry waiting
    a whole timeout again, where poke and reschedule modes end with AirflowSensorTimeout (no retries)."""
    from airflow.providers.common.compat.sdk import AirflowSensorTimeout  # noqa: PLC0415

    from liftbridge_provider.sensors.offset import LiftbridgePartitionOffsetSensor  # noqa: PLC0415

    sensor = LiftbridgePartitionOffsetSensor(
        task_id="w", stream="s", target_offsets={0: 5}, deferrable=True, timeout=60
    )
    with pytest.raises(AirflowSensorTimeout):
        sensor.execute_complete({}, {"status": "timeout", "missing": {"0": 3}, "note": ""})


@pytest.mark.parametrize("which", ["lag", "offset"])
def test_sensors_refuse_an_empty_partition_list(which: str) -> None:
    """partitions=[] checked nothing and succeeded at once."""
    from airflow.providers.common.compat.sdk import AirflowFailException  # noqa: PLC0415

    from liftbridge_provider.sensors.lag import LiftbridgeCursorLagSensor  # noqa: PLC0415
    from liftbridge_provider.sensors.offset import LiftbridgePartitionOffsetSensor  # noqa: PLC0415

    sensor: Any = (
        LiftbridgeCursorLagSensor(task_id="l", stream="s", cursor_id="c", partitions=[])
        if which == "lag"
        else LiftbridgePartitionOffsetSensor(task_id="o", stream="s", target_offset=9, partitions=[])
    )
    with pytest.raises(AirflowFailException, match="partitions of stream 's' is empty"):
        sensor.poke({})


def test_a_group_member_freezes_again_when_the_group_assigns_it_other_partitions() -> None:
    """A consume task in a consumer group keeps its frozen ranges across retries only while the group assigns
    it the same partitions. Before, a retry reused the first try's ranges after the group had moved a
    partition to another member, and consumed (and committed on the group's cursor) a partition it no longer
    owned, beside the member that did."""
    from liftbridge_provider.core.ranges import OffsetRange, RangesDocument  # noqa: PLC0415

    member = _consume(cursor_id=None, group_id="g")
    earlier = RangesDocument("s", (OffsetRange(0, 0, 5), OffsetRange(1, 0, 5)), "__group:g").to_json()
    member.partitions = [1]  # the group now gives partition 0 to another member
    assert member._stored_ranges(earlier) is None, "the first try's ranges of partition 0 were reused"
    member.partitions = [0, 1]
    assert member._stored_ranges(earlier) == earlier, "the same assignment keeps the frozen ranges"
    alone = _consume()  # not in a group: its partitions are the user's, the frozen ranges stay
    alone.partitions = [1]
    assert alone._stored_ranges({**earlier, "cursor_id": "c"}) is not None
