"""Bad input to the Airflow faces is refused before anything is sent (issue 11, the probe's Airflow cases)."""

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
    ],
)
def test_offset_trigger_refuses_negative_targets_and_intervals(kwargs: dict[str, Any], message: str) -> None:
    """Issue 11 (bad input): LiftbridgeOffsetTrigger accepted negative targets and poll intervals."""
    with pytest.raises(InvalidArgumentError, match=message):
        LiftbridgeOffsetTrigger(stream="s", **kwargs)


@pytest.mark.parametrize("record", [42, 4.5, True, None, [1, 2], object()])
def test_records_that_are_not_bytes_str_or_mappings_are_refused(record: Any) -> None:
    """Issue 11 (bad input): an int record was published as b"42"."""
    refused = f"record must be bytes, str or a mapping, got {type(record).__name__}"
    with pytest.raises(InvalidArgumentError, match=refused):
        record_to_message(record)


def test_mapping_fields_may_still_be_numbers() -> None:
    record = {"id": 7, "amount": 2.5}
    assert record_to_message(record, key_field="id", value_field="amount") == PublishMessage(value=b"2.5", key=b"7")
