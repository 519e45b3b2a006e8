"""From a time to an offset: the first offset whose message the server received at or after it, without I/O.

The server answers this from its time index (a Subscribe starting at a
TIMESTAMP), but the v1.9.0 server answers "past the end of the log" for any
time when the binary search over its segments touches a segment whose index
is still empty (right after a roll, or after retention emptied the log):
an interval would then lose its messages without a word. So the server's
answer is only a hint, checked with two reads; a wrong one is replaced by a
binary search over offsets, which needs nothing but reads.

``read(offset)`` is the first message at or after ``offset`` up to the high
watermark, as ``(offset, time)``, or None when there is none (compaction
leaves gaps: a read lands on the next message kept). Reads start at or after
the oldest retained offset (``earliest``): below it the server has nothing to
send and a read would only wait.
"""

from __future__ import annotations

from collections.abc import Callable

Read = Callable[[int], "tuple[int, int] | None"]


def first_offset_at_or_after(when: int, *, earliest: int, high_watermark: int, hint: int, read: Read) -> int:
    """The smallest offset ``o`` in ``[earliest, high_watermark + 1]`` from which no message is older than
    ``when`` (nanoseconds): the first message at or after ``o`` was received at or after ``when``, and the
    one at or after ``o - 1`` was not (or ``o`` is ``earliest``). ``high_watermark + 1`` when every
    committed message is older. Times are taken to grow with offsets (one leader's clock), as the server's
    own index does."""

    def none_older_from(offset: int) -> bool:
        if offset > high_watermark:
            return True
        found = read(offset)
        return found is None or found[1] >= when

    low, high = earliest, high_watermark + 1  # none_older_from(high) holds
    if low <= hint <= high and none_older_from(hint) and (hint == low or not none_older_from(hint - 1)):
        return hint
    while low < high:
        middle = (low + high) // 2
        if none_older_from(middle):
            high = middle
        else:
            low = middle + 1
    return low
