"""Move a cursor to the end of each frozen range: a compare-and-set, idempotent (the step after the ingest)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.providers.common.compat.sdk import AirflowException, AirflowFailException

from liftbridge_provider import telemetry
from liftbridge_provider.client import CursorMove, CursorMovedError, CursorStep, LiftbridgeClient
from liftbridge_provider.core.ranges import (
    Committable,
    OffsetRange,
    RangesDocument,
    check_partitions,
    committable,
    frozen_cursor,
    frozen_high_watermark,
)
from liftbridge_provider.operators._base import LiftbridgeBaseOperator


class LiftbridgeCommitCursorOperator(LiftbridgeBaseOperator):
    """Move the cursor to the end of each range of a ranges document: a compare-and-set, idempotent.

    For each non-empty range the cursor moves to ``end - 1`` (the last offset
    processed) only if it is still where the freeze found it: ``start - 1``, or
    the offset the document records under ``metadata.frozen_cursors``. A cursor
    already at ``end - 1`` is left alone (a repeated commit succeeds and does
    nothing). Any other position fails the task without retries, naming the
    stream, partition, and the expected and found offsets: someone else moved
    the cursor (an overlapping run, another pipeline), so committing would skip
    or repeat offsets. Every partition is checked before any cursor moves.
    An empty range that starts past the cursor the freeze read (retention
    removed the offsets in between and ``on_data_loss="skip"`` skipped them)
    moves the cursor to ``start - 1`` if it has not moved; other empty ranges
    leave it alone. Returns ``{partition: cursor offset}``, and sends each
    partition's lag as the gauge ``liftbridge.cursor_lag``.

    The cursors move by the client's cursor-advance rule (``advance_cursors``):
    never back (a range that ends behind where the freeze found the cursor
    fails the task without retries), and each written cursor is read back, so
    a commit another writer overwrote right after it fails the task. Liftbridge
    has no server-side compare-and-set for cursors: a write of another writer
    that lands between the check and the set is overwritten unseen, and the last
    write wins. Keep one writer per cursor: run the DAG with
    ``max_active_runs=1`` and give each pipeline its own cursor id.

    A range must be committed: offsets past the committed high watermark cannot
    have been read. The commit waits for it (within the request timeout) while
    the leader holds the offsets. A high watermark that moved back below a range
    (a single replica restarted after a crash takes its last checkpoint, up to
    5 s old, and commits again only with the next message published to it) does
    not stop the commit when the document's ``metadata.frozen_high_watermarks``
    says the freeze saw the range committed and the leader still holds its
    offsets: the cursor moves, with a warning naming the partition, the high
    watermark and the offsets held. A range past the high watermark that the
    leader holds but nothing says was committed, or that the freeze saw
    committed but the leader no longer holds, fails the try with a retryable
    error; one neither committed at the freeze nor held now (an ``end`` given
    past what the partition holds) fails it without retries.

    Lineage: once the cursors moved, the stream is reported to Airflow's hook
    lineage as an input that carries the committed ranges (OpenLineage: the
    ``liftbridge_offsets`` dataset facet), so the commit's event names the
    offsets the cursor now covers.

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
            count = len(client.stream_info(document.stream).partitions)  # a missing stream stores no cursor
            check_partitions([r.partition for r in document.ranges], count, document.stream)
            recorded = {
                r.partition: frozen_cursor(document, r.partition) if cursor_id == document.cursor_id else None
                for r in document.ranges
            }
            filled = [r for r in document.ranges if r.last is not None]
            for offset_range in filled:  # nothing past the committed high watermark can have been ingested
                self._check_committed(client, document, offset_range)
            targets = {r.partition: r.last for r in filled if r.last is not None}
            expected = {r.partition: _before(r, recorded[r.partition]) for r in filled}
            try:
                moves = client.advance_cursors(cursor_id, document.stream, targets, expected=expected, verify=True)
            except CursorMovedError as moved:
                raise AirflowFailException(_refusal(document, moved)) from moved
            positions = {}
            for offset_range in document.ranges:
                partition = offset_range.partition
                if partition in moves:
                    positions[partition] = self._logged(moves[partition])
                else:
                    positions[partition] = self._empty_range(client, document, cursor_id, offset_range, recorded)
                high_watermark = client.fetch_partition_metadata(document.stream, partition).high_watermark
                lag = telemetry.cursor_lag(high_watermark, positions[partition])
                telemetry.gauge(
                    telemetry.CURSOR_LAG, lag, stream=document.stream, partition=partition, cursor_id=cursor_id
                )
        self.hook.report_read(document.stream, ranges=document.ranges, cursor_id=cursor_id)
        return {str(partition): offset for partition, offset in positions.items()}

    def _logged(self, move: CursorMove) -> int:
        if move.step is CursorStep.ALREADY_THERE:
            self.log.info("partition %d: cursor %r is already at %d (committed before)", move.partition,
                          move.cursor_id, move.target)  # fmt: skip
        else:
            self.log.info("partition %d: cursor %r %d -> %d", move.partition, move.cursor_id, move.found, move.target)
        return move.target

    def _empty_range(
        self,
        client: LiftbridgeClient,
        document: RangesDocument,
        cursor_id: str,
        offset_range: OffsetRange,
        recorded: Mapping[int, int | None],
    ) -> int:
        """Where an empty range leaves the cursor: at ``start - 1`` when the freeze started past the cursor
        it read (offsets removed by retention, skipped) and the cursor is still there, so later runs do not
        meet that loss again; else put (a cursor another writer moved included)."""
        partition, skipped_to, seen = offset_range.partition, offset_range.start - 1, recorded[offset_range.partition]
        if seen is None or skipped_to <= seen:
            current = client.fetch_cursor(cursor_id, document.stream, partition)
            self.log.info("partition %d: empty range; cursor %r stays at %d", partition, cursor_id, current)
            return current
        try:
            client.advance_cursor(cursor_id, document.stream, partition, skipped_to, expected=seen, verify=True)
        except CursorMovedError as moved:
            if moved.overwritten:
                raise AirflowFailException(_refusal(document, moved)) from moved
            self.log.info("partition %d: empty range; cursor %r stays at %d", partition, cursor_id, moved.found)
            return moved.found
        self.log.info("partition %d: empty range after offsets %d-%d were skipped at the freeze; cursor %r %d -> %d",
                      partition, seen + 1, skipped_to, cursor_id, seen, skipped_to)  # fmt: skip
        return skipped_to

    def _check_committed(self, client: LiftbridgeClient, document: RangesDocument, offset_range: OffsetRange) -> None:
        """Refuse a range whose offsets cannot all have been ingested: past the partition's committed high
        watermark (waited for, within the request timeout, while the leader holds it uncommitted), unless the
        freeze saw them committed and the leader still holds them (the high watermark moved back: a warning).
        Moving the cursor past offsets no run ingested would skip them for good."""
        partition, last = offset_range.partition, offset_range.last
        assert last is not None
        info = client.wait_for_commit(document.stream, partition, last)
        frozen = frozen_high_watermark(document, partition)
        verdict = committable(
            offset_range, high_watermark=info.high_watermark, newest_offset=info.newest_offset, frozen=frozen
        )
        if verdict is Committable.COMMITTED:
            return
        past = (
            f"partition {partition}: the range [{offset_range.start}, {offset_range.end}) ends past the committed "
            f"high watermark {info.high_watermark}"
        )
        if verdict is Committable.MOVED_BACK:
            self.log.warning(
                "partition %d: the high watermark %d moved back below the range [%d, %d), which the freeze saw "
                "committed (high watermark %d) and the leader still holds offsets up to %d: committing (a single "
                "replica restarted after a crash takes its last checkpoint, and commits again with the next "
                "message published to it)",
                partition, info.high_watermark, offset_range.start, offset_range.end, frozen, info.newest_offset,
            )  # fmt: skip
            return
        if verdict is Committable.HELD_UNCOMMITTED:
            seen = "does not record the freeze's high watermark" if frozen is None else f"says the freeze saw {frozen}"
            raise AirflowException(
                f"{past}; the leader holds offsets up to {info.newest_offset} but has not committed them, and the "
                f"ranges document {seen}; no cursor was moved. The task is retried: a leader commits as its "
                "followers fetch, and a single replica restarted after a crash with the next message published "
                "to it; wait for the offsets (LiftbridgePartitionOffsetSensor) before committing"
            )
        if verdict is Committable.NOT_HELD:
            raise AirflowException(
                f"{past}: the freeze saw them committed (high watermark {frozen}), but the leader holds offsets "
                f"only up to {info.newest_offset}; no cursor was moved. The task is retried, as a leader change "
                "may bring them back; if it keeps failing, the partition lost offsets the run ingested: check its "
                "replicas before committing"
            )
        raise AirflowFailException(
            f"{past}, so it cannot all have been ingested; wait for it (LiftbridgePartitionOffsetSensor) before "
            "committing; no cursor was moved"
        )


def _before(offset_range: OffsetRange, recorded: int | None) -> int:
    """Where the commit expects the cursor before a range: where the freeze found it, else ``start - 1``."""
    return offset_range.start - 1 if recorded is None else recorded


def _refusal(document: RangesDocument, moved: CursorMovedError) -> str:
    """The task's failure for a cursor move the cursor-advance rule refused."""
    if moved.overwritten:
        return (
            f"{moved}: another writer commits cursor {moved.cursor_id!r} too (the partitions before it in the "
            "document were committed); keep one writer per cursor"
        )
    offset_range = next(r for r in document.ranges if r.partition == moved.partition)
    return (
        f"cursor {moved.cursor_id!r} of stream {document.stream!r} partition {moved.partition} is at {moved.found}, "
        f"expected {moved.expected} (before the range [{offset_range.start}, {offset_range.end})) or {moved.target} "
        "(already committed): someone else moved it, so committing would skip or repeat offsets; no cursor was moved"
    )
