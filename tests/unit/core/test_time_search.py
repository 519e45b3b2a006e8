"""From a time to an offset (core/time_search.py): the server's hint is checked, a wrong one replaced."""

from __future__ import annotations

import pytest

from liftbridge_provider.core.time_search import Read, first_offset_at_or_after

# offset -> time; offsets 3 and 7 were compacted away, 0-1 removed by retention (the log starts at 2)
LOG = {2: 100, 4: 200, 5: 200, 6: 300, 8: 400, 9: 500}
HIGH_WATERMARK = 9


def reader(reads: list[int]) -> Read:
    def read(offset: int) -> tuple[int, int] | None:
        reads.append(offset)
        kept = [o for o in sorted(LOG) if o >= offset]
        return (kept[0], LOG[kept[0]]) if kept else None

    return read


def search(when: int, hint: int, reads: list[int] | None = None) -> int:
    return first_offset_at_or_after(
        when, earliest=2, high_watermark=HIGH_WATERMARK, hint=hint, read=reader([] if reads is None else reads)
    )


@pytest.mark.parametrize(
    ("when", "answer"),
    [
        (50, 2),  # older than everything kept: the oldest retained offset
        (100, 2),
        (101, 3),  # right after offset 2 (3 is a gap: same messages as 4)
        (200, 3),
        (250, 6),
        (300, 6),
        (301, 7),
        (500, 9),
        (501, 10),  # newer than everything: the high watermark + 1
    ],
)
def test_the_answer_is_the_offset_right_after_the_last_older_message(when: int, answer: int) -> None:
    for hint in (answer, 2, 10, 5, 0, 99):  # a right hint, and wrong ones (the v1.9.0 server answers 10 wrongly)
        assert search(when, hint) == answer, (when, hint)


def test_a_right_hint_costs_two_reads() -> None:
    reads: list[int] = []
    assert search(250, 6, reads) == 6
    assert reads == [6, 5]


def test_a_wrong_hint_costs_a_binary_search() -> None:
    reads: list[int] = []
    assert search(250, 10, reads) == 6  # "past the end", the server's answer when its newest segment is empty
    assert len(reads) <= 2 + 4, reads
