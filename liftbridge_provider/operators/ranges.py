"""Freeze offset ranges before a run, and move a cursor to their end after it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from airflow.sdk.exceptions import AirflowFailException

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.operators._base import LiftbridgeBaseOperator
from liftbridge_provider.ranges import OffsetRange, RangesDocument, check_partitions, partition_offsets

StartFrom = Literal["cursor", "earliest"]
EndAt = Literal["high_watermark"]


class LiftbridgeOffsetRangesOperator(LiftbridgeBaseOperator):
    """Freeze a half-open range ``[start, end)`` per partition; returns the ranges document (XCom).

    The Spark ingest job reads exactly these ranges and the commit step moves
    the cursor to their ends, so a rerun repeats the same work.

    :param stream: stream name.
    :param partitions: partitions to include (default: all).
    :param start: ``"cursor"`` (default: the offset after ``cursor_id``'s stored
        offset; 0 if never set), ``"earliest"`` (the oldest retained offset), or
        ``{partition: offset}``.
    :param end: ``"high_watermark"`` (default: the leader's high watermark + 1)
        or ``{partition: offset}`` (exclusive).
    :param cursor_id: the cursor ranges start from and are committed to
        (needed for ``start="cursor"``).
    :param max_messages_per_partition: cap each range at this many offsets (default: no cap).
    :param on_data_loss: when retention already removed offsets at the start:
        ``"fail"`` (default, like Spark's failOnDataLoss) or ``"skip"`` (start at
        the oldest retained offset, with a warning).
    """

    template_fields = (*LiftbridgeBaseOperator.template_fields, "stream", "cursor_id", "start", "end")

    def __init__(
        self,
        *,
        stream: str,
        partitions: Sequence[int] | None = None,
        start: StartFrom | Mapping[Any, int] = "cursor",
        end: EndAt | Mapping[Any, int] = "high_watermark",
        cursor_id: str | None = None,
        max_messages_per_partition: int | None = None,
        on_data_loss: Literal["fail", "skip"] = "fail",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if isinstance(start, str) and start not in ("cursor", "earliest"):
            raise ValueError(f"start must be 'cursor', 'earliest' or {{partition: offset}}, got {start!r}")
        if start == "cursor" and not cursor_id:
            raise ValueError("start='cursor' needs a cursor_id")
        if isinstance(end, str) and end != "high_watermark":
            raise ValueError(f"end must be 'high_watermark' or {{partition: offset}}, got {end!r}")
        if max_messages_per_partition is not None and max_messages_per_partition < 1:
            raise ValueError(f"max_messages_per_partition must be >= 1, got {max_messages_per_partition!r}")
        if on_data_loss not in ("fail", "skip"):
            raise ValueError(f"on_data_loss must be 'fail' or 'skip', got {on_data_loss!r}")
        self.stream = stream
        self.partitions = partitions
        self.start = start
        self.end = end
        self.cursor_id = cursor_id
        self.max_messages_per_partition = max_messages_per_partition
        self.on_data_loss = on_data_loss

    def execute(self, context: Any) -> dict[str, Any]:
        with self.client() as client:
            count = len(client.stream_info(self.stream).partitions)
            partitions = check_partitions(self.partitions, count, self.stream)
            starts = None if isinstance(self.start, str) else partition_offsets(self.start, "start")
            ends = None if isinstance(self.end, str) else partition_offsets(self.end, "end")
            ranges = [self._range(client, p, starts, ends) for p in partitions]
        document = RangesDocument(self.stream, tuple(ranges), self.cursor_id)
        for r in document.ranges:
            self.log.info("partition %d: [%d, %d) = %d offsets", r.partition, r.start, r.end, r.count)
        return document.to_json()

    def _range(
        self, client: LiftbridgeClient, partition: int, starts: dict[int, int] | None, ends: dict[int, int] | None
    ) -> OffsetRange:
        high_watermark = client.fetch_partition_metadata(self.stream, partition).high_watermark
        end = high_watermark + 1 if ends is None else self._given(ends, partition, "end")
        if starts is not None:
            start = self._given(starts, partition, "start")
        elif self.start == "cursor":
            start = client.fetch_cursor(self.cursor_id, self.stream, partition) + 1  # type: ignore[arg-type]
        else:
            start = client.earliest_offset(self.stream, partition) or 0
        if start < end and self.start != "earliest":  # a start taken from earliest_offset is retained
            start = self._check_retained(client, partition, start)
        end = max(end, start) if ends is None else end
        if self.max_messages_per_partition is not None:
            end = min(end, start + self.max_messages_per_partition)
        if end < start:
            raise AirflowFailException(f"partition {partition}: end {end} is before start {start}")
        return OffsetRange(partition, start, end)

    def _given(self, offsets: dict[int, int], partition: int, what: str) -> int:
        if partition not in offsets:
            raise AirflowFailException(f"{what} offsets {offsets} give nothing for partition {partition}")
        return offsets[partition]

    def _check_retained(self, client: LiftbridgeClient, partition: int, start: int) -> int:
        earliest = client.earliest_offset(self.stream, partition)
        if earliest is None or start >= earliest:
            return start
        message = f"partition {partition}: offsets {start}-{earliest - 1} were already removed by retention"
        if self.on_data_loss == "fail":
            raise AirflowFailException(message + " (on_data_loss='fail'; set 'skip' to start at the oldest one)")
        self.log.warning("%s; starting at %d (on_data_loss='skip')", message, earliest)
        return earliest


class LiftbridgeCommitCursorOperator(LiftbridgeBaseOperator):
    """Move the cursor to the end of each range of a ranges document; idempotent.

    For each non-empty range the cursor is set to ``end - 1`` (the last offset
    processed). A cursor already beyond that is left alone (a rerun of an older
    run never moves it back). Returns ``{partition: cursor offset}``.

    :param ranges: the ranges document (dict, JSON, or an upstream XCom via ``XComArg``).
    :param cursor_id: the cursor (default: the document's ``cursor_id``).
    """

    template_fields = (*LiftbridgeBaseOperator.template_fields, "ranges", "cursor_id")

    def __init__(
        self, *, ranges: RangesDocument | Mapping[str, Any] | str, cursor_id: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.ranges = ranges
        self.cursor_id = cursor_id

    def execute(self, context: Any) -> dict[str, int]:
        with self.client() as client:
            document = RangesDocument.parse(self.ranges)
            cursor_id = self.cursor_id or document.cursor_id
            if not cursor_id:
                raise AirflowFailException("no cursor_id: give one, or freeze the ranges with a cursor_id")
            committed = {}
            for offset_range in document.ranges:
                last = offset_range.last
                current = client.fetch_cursor(cursor_id, document.stream, offset_range.partition)
                if last is None or current >= last:
                    self.log.info("partition %d: cursor %r stays at %d", offset_range.partition, cursor_id, current)
                    committed[str(offset_range.partition)] = current
                    continue
                client.set_cursor(cursor_id, document.stream, offset_range.partition, last)
                self.log.info("partition %d: cursor %r %d -> %d", offset_range.partition, cursor_id, current, last)
                committed[str(offset_range.partition)] = last
        return committed
