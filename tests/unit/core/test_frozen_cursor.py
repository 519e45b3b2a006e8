"""The cursor a freeze recorded in the ranges document (core/ranges.py ``frozen_cursor``), read by commit and consume.

A wrong recorded offset would make the commit expect the cursor somewhere it
never was; a malformed one must fail naming the partition and the value.
"""

from __future__ import annotations

from typing import Any

import pytest

from liftbridge_provider.core.errors import InvalidArgumentError
from liftbridge_provider.core.ranges import FROZEN_CURSORS, OffsetRange, RangesDocument, frozen_cursor


def document(metadata: dict[str, Any]) -> RangesDocument:
    return RangesDocument("events", (OffsetRange(0, 5, 9), OffsetRange(1, 0, 0)), "ingest", metadata)


def test_the_recorded_offset_of_a_partition_is_returned_and_an_unrecorded_one_is_none() -> None:
    recorded = document({FROZEN_CURSORS: {"0": 4, "1": -1}})
    assert frozen_cursor(recorded, 0) == 4
    assert frozen_cursor(recorded, 1) == -1
    assert frozen_cursor(recorded, 2) is None
    assert frozen_cursor(document({}), 0) is None
    assert frozen_cursor(document({FROZEN_CURSORS: "not a mapping"}), 0) is None


@pytest.mark.parametrize("bad", [-2, True, "4", 4.0, None])
def test_a_malformed_recorded_offset_fails_naming_the_partition_and_the_value(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"{FROZEN_CURSORS} of partition 0 must be >= -1, got {bad!r}"):
        frozen_cursor(document({FROZEN_CURSORS: {"0": bad}}), 0)
