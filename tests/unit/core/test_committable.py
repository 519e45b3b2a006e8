"""Whether the commit step may move a cursor to the end of a range (core/ranges.py ``committable``).

The cursor must never pass offsets no run ingested, and offsets past the
committed high watermark cannot have been read, except when the high
watermark moved back after they were read (chaos seed 88: a single replica
restarted after a crash took its last checkpoint, -1, and the commit of
[0, 49), frozen and ingested while committed, failed without retries).
"""

from __future__ import annotations

from typing import Any

import pytest

from liftbridge_provider.core.errors import InvalidArgumentError
from liftbridge_provider.core.ranges import (
    FROZEN_HIGH_WATERMARKS,
    Committable,
    OffsetRange,
    RangesDocument,
    committable,
    frozen_high_watermark,
)

SEED_88 = OffsetRange(0, 0, 49)


@pytest.mark.parametrize(
    ("high_watermark", "newest_offset", "frozen", "expected"),
    [
        (48, 48, 48, Committable.COMMITTED),
        (60, 60, None, Committable.COMMITTED),  # committed now: no record needed
        (-1, 48, 48, Committable.MOVED_BACK),  # seed 88: restarted with the high watermark at -1
        (20, 70, 48, Committable.MOVED_BACK),  # back at an old checkpoint, new offsets held since
        (-1, 48, None, Committable.HELD_UNCOMMITTED),  # no record: nothing says it was committed
        (-1, 48, 47, Committable.HELD_UNCOMMITTED),  # frozen past what was committed (a given end)
        (-1, 47, 48, Committable.NOT_HELD),  # the freeze saw 48 committed; the leader lacks it
        (-1, -1, 48, Committable.NOT_HELD),
        (9, 9, 9, Committable.NEVER_HELD),  # an end given past what the partition holds
        (-1, 20, None, Committable.NEVER_HELD),
    ],
)
def test_a_range_past_the_high_watermark_is_committed_only_on_the_freezes_word_and_while_held(
    high_watermark: int, newest_offset: int, frozen: int | None, expected: Committable
) -> None:
    assert committable(SEED_88, high_watermark=high_watermark, newest_offset=newest_offset, frozen=frozen) is expected


def test_an_empty_range_has_nothing_to_commit() -> None:
    with pytest.raises(InvalidArgumentError, match="partition 3: the range is empty"):
        committable(OffsetRange(3, 5, 5), high_watermark=10, newest_offset=10, frozen=10)


def document(metadata: dict[str, Any]) -> RangesDocument:
    return RangesDocument("events", (SEED_88,), "ingest", metadata)


def test_the_recorded_high_watermark_of_a_partition_is_returned_and_an_unrecorded_one_is_none() -> None:
    recorded = document({FROZEN_HIGH_WATERMARKS: {"0": 48, "1": -1}})
    assert frozen_high_watermark(recorded, 0) == 48
    assert frozen_high_watermark(recorded, 1) == -1
    assert frozen_high_watermark(recorded, 2) is None
    assert frozen_high_watermark(document({}), 0) is None


@pytest.mark.parametrize("bad", [-2, True, "48", 48.0, None])
def test_a_malformed_recorded_high_watermark_fails_naming_the_partition_and_the_value(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"{FROZEN_HIGH_WATERMARKS} of partition 0 must be >= -1"):
        frozen_high_watermark(document({FROZEN_HIGH_WATERMARKS: {"0": bad}}), 0)
