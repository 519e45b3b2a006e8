"""Freeze offset ranges once per DAG run, and move a cursor to their end after it (compare-and-set)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from airflow.providers.common.compat.sdk import AirflowException, AirflowFailException, conf

from liftbridge_provider import telemetry
from liftbridge_provider.client import (
    InvalidArgumentError,
    LiftbridgeClient,
    PartitionPausedError,
    StartPosition,
)
from liftbridge_provider.client.metadata import PartitionInfo
from liftbridge_provider.core.ranges import (
    FROZEN_CURSORS,
    FROZEN_HIGH_WATERMARKS,
    OffsetRange,
    RangesDocument,
    check_chosen_partitions,
    check_retention,
    interval_start_may_be_lost,
    parse_instant,
    partition_offsets,
)
from liftbridge_provider.cursor_state import CursorStateStore
from liftbridge_provider.delta_table import table_offsets
from liftbridge_provider.hooks.object_store import aws_s3_settings
from liftbridge_provider.operators._base import LiftbridgeBaseOperator, failing_without_retries, run_state
from liftbridge_provider.operators.commit import LiftbridgeCommitCursorOperator

# The commit step keeps its public path here too (it lived in this module before operators/commit.py).
__all__ = ["LiftbridgeCommitCursorOperator", "LiftbridgeOffsetRangesOperator"]

StartFrom = Literal["cursor", "earliest"]
EndAt = Literal["high_watermark"]

STATE_KEY = "liftbridge_ranges"  # run state key (operators._base.run_state): the ranges document frozen by this run
CURSOR_LAG = "cursor_lag"  # document metadata: {partition: offsets between the cursor and the high watermark}
INTERVAL = "interval"  # document metadata: {"start": ISO time, "end": ISO time} of a time-bounded freeze
# Airflow 3.3's NEVER_EXPIRE (airflow.sdk.execution_time.context), which the task state store checks by identity:
# a row kept with it has no expiry, so `airflow state-store clean` never deletes it; it goes with its DAG run.
NEVER_EXPIRE = timedelta.max


def _where(store: Any) -> str:
    return "in the stream's cursors" if isinstance(store, CursorStateStore) else "in the task state store"


def _keep(store: Any, document: dict[str, Any]) -> None:
    """Keep the run's ranges for as long as the run: in Airflow's task state store without an expiry (with the
    default, ``[state_store] default_retention_days``, a clear 30 days later froze new ranges); the cursor
    store keeps values while the server keeps ``__cursors`` (cursor_state.py)."""
    if isinstance(store, CursorStateStore):
        store.set(STATE_KEY, document)
    else:
        store.set(STATE_KEY, document, retention=NEVER_EXPIRE)


def _why_gone(store: Any) -> str:
    """What may have removed the ranges an earlier try of this run kept, for the log of a new freeze."""
    if isinstance(store, CursorStateStore):
        return (
            "an earlier try ended before it kept them, or the server's retention removed the __cursors "
            "messages that held them (streams.retention.max.age), or they were kept before issue 47's layout"
        )
    if conf.getboolean("state_store", "clear_on_success", fallback=False):
        return (
            "[state_store] clear_on_success=True deletes them when the task succeeds, so a clear after a "
            "success finds nothing (or an earlier try ended before it kept them)"
        )
    return (
        "an earlier try ended before it kept them, or they were deleted (by hand, or by `airflow state-store "
        "clean` once the expiry of a row kept by an older provider version passed)"
    )


class LiftbridgeOffsetRangesOperator(LiftbridgeBaseOperator):
    """Freeze a half-open range ``[start, end)`` per partition, once per DAG run; returns the ranges document.

    The Spark ingest job reads exactly these ranges and the commit step moves
    the cursor to their ends. The document is kept in Airflow's task state
    store (Airflow 3.3+, without an expiry: it goes with its DAG run), or where
    Airflow has none in the stream's own cursors
    (:class:`~liftbridge_provider.cursor_state.CursorStateStore`), so a retry or
    a clear of the same run returns the same ranges instead of freezing bigger
    ones; a new run freezes anew. With ``[state_store] clear_on_success=True``
    Airflow deletes it when the task succeeds: a clear after a success freezes
    anew, and a try that finds nothing kept says so and why in its log.

    Paused partitions are not resumed when their range is empty; a non-empty
    range resumes its partition (reading it will need the data anyway).

    With ``start_time`` / ``end_time`` (templated, e.g. ``"{{ data_interval_start }}"``
    and ``"{{ data_interval_end }}"``) the ranges hold exactly the messages the
    server received in ``[start_time, end_time)`` on each partition (its time
    index, the leaders' clocks): a scheduled run ingests its interval, and a
    backfill of an old interval freezes the same ranges while retention keeps
    its messages. An ``end_time`` still in the future fails the try (retried).

    The document's ``metadata.frozen_high_watermarks`` records, per partition,
    the committed high watermark the freeze read: the commit step's evidence
    that a range was committed once when the high watermark has moved back since.

    With a ``cursor_id``, the document's ``metadata.cursor_lag`` gives, per
    partition, the offsets between the cursor and the high watermark, also sent
    as the Airflow gauge ``liftbridge.cursor_lag`` (tags stream, partition,
    cursor_id).

    :param stream: stream name.
    :param partitions: partitions to include (default: all).
    :param start: ``"cursor"`` (default: the offset after ``cursor_id``'s stored
        offset; 0 if never set), ``"earliest"`` (the oldest retained offset), or
        ``{partition: offset}``, or ``"delta"`` (the next offsets the Delta table
        ``delta_table`` holds, as ``ingest.py --format delta`` wrote them; partitions
        it lacks start at the earliest); leave it when giving ``start_time``.
    :param end: ``"high_watermark"`` (default: the leader's high watermark + 1)
        or ``{partition: offset}`` (exclusive); leave it when giving ``end_time``.
    :param start_time: start at the first message received at or after this time
        (an aware datetime or ISO 8601 text with a time zone).
    :param end_time: end before the first message received at or after this time.
    :param cursor_id: the cursor ranges start from and are committed to
        (needed for ``start="cursor"`` without ``start_time``).
    :param max_messages_per_partition: cap each range at this many offsets (default: no cap).
    :param compacted: the stream is compacted (default False): offsets missing
        at a range's head are compaction gaps, logged, never data loss.
    :param on_data_loss: when retention already removed offsets at the start
        (streams that are not ``compacted``): ``"fail"`` (default, like Spark's
        failOnDataLoss) or ``"skip"`` (start at the oldest retained offset, with a warning).
    :param delta_table: the Delta table for ``start="delta"``: a local path, or on S3
        (``s3a://bucket/key``, with ``aws_conn_id``); needs the ``deltalake`` package on the worker.
    :param aws_conn_id: the Amazon provider's ``aws`` connection of a ``delta_table`` on S3
        (keys, ``endpoint_url``, ``region_name``): the one the Spark step gets too
        (``hooks/object_store.py``), so both read the table with the same settings.

    Lineage: the stream is reported to Airflow's hook lineage as an input that
    carries the run's ranges (OpenLineage: the ``liftbridge_offsets`` dataset facet).
    """

    template_fields = (
        *LiftbridgeBaseOperator.template_fields,
        "stream",
        "cursor_id",
        "start",
        "end",
        "start_time",
        "end_time",
        "delta_table",
    )

    def __init__(
        self,
        *,
        stream: str,
        partitions: Sequence[int] | None = None,
        start: StartFrom | Literal["delta"] | Mapping[Any, int] = "cursor",
        end: EndAt | Mapping[Any, int] = "high_watermark",
        start_time: datetime | str | None = None,
        end_time: datetime | str | None = None,
        cursor_id: str | None = None,
        max_messages_per_partition: int | None = None,
        compacted: bool = False,
        on_data_loss: Literal["fail", "skip"] = "fail",
        delta_table: str | None = None,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if isinstance(start, str) and start not in ("cursor", "earliest", "delta"):
            raise ValueError(f"start must be 'cursor', 'earliest', 'delta' or {{partition: offset}}, got {start!r}")
        if (start == "delta") != (delta_table is not None):
            raise ValueError(
                f"start='delta' and delta_table go together (start={start!r}, delta_table={delta_table!r})"
            )
        if start_time is not None and start != "cursor":
            raise ValueError(f"give start or start_time, not both (start={start!r})")
        if end_time is not None and end != "high_watermark":
            raise ValueError(f"give end or end_time, not both (end={end!r})")
        if start == "cursor" and start_time is None and not cursor_id:
            raise ValueError("start='cursor' needs a cursor_id (or give start_time)")
        if isinstance(end, str) and end != "high_watermark":
            raise ValueError(f"end must be 'high_watermark' or {{partition: offset}}, got {end!r}")
        if max_messages_per_partition is not None and start_time is not None:
            raise ValueError("max_messages_per_partition would cut an interval short: not with start_time")
        if max_messages_per_partition is not None and max_messages_per_partition < 1:
            raise ValueError(f"max_messages_per_partition must be >= 1, got {max_messages_per_partition!r}")
        if not isinstance(compacted, bool):
            raise ValueError(f"compacted must be True or False, got {compacted!r}")
        if on_data_loss not in ("fail", "skip"):
            raise ValueError(f"on_data_loss must be 'fail' or 'skip', got {on_data_loss!r}")
        self.stream = stream
        self.partitions = partitions
        self.start = start
        self.end = end
        self.start_time = start_time
        self.end_time = end_time
        self.cursor_id = cursor_id
        self.max_messages_per_partition = max_messages_per_partition
        self.compacted = compacted
        self.on_data_loss = on_data_loss
        self.delta_table = delta_table
        self.aws_conn_id = aws_conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        document = self._run_ranges(context)
        parsed = RangesDocument.parse(document)
        self.hook.report_read(parsed.stream, ranges=parsed.ranges, cursor_id=parsed.cursor_id)
        return document

    def _run_ranges(self, context: Any) -> dict[str, Any]:
        """The ranges document of this DAG run: the one kept in the run's state, else frozen now."""
        with self.client() as client:
            store = run_state(context, client, self.stream)
            kept = store.get(STATE_KEY)
            if (stored := self._stored_ranges(kept)) is not None:
                return stored
        try_number = getattr(context.get("ti"), "try_number", None) or 1
        if kept is None and try_number > 1:
            self.log.warning(
                "try %d of this run, but no ranges are kept for it (%s): %s. Freezing anew: the new ranges may "
                "be bigger than the ones an earlier try froze; the commit's cursor-advance rule and the lake's "
                "ledger keep every offset once",
                try_number,
                _where(store),
                _why_gone(store),
            )
        document = self._freeze()
        with self.client():
            _keep(store, document)
        self.log.info("ranges kept (%s): a retry or clear of this run reuses them", _where(store))
        return document

    def _stored_ranges(self, value: Any) -> dict[str, Any] | None:
        """The document an earlier try of this run froze, if it is for this stream and cursor."""
        if value is None:
            return None
        with failing_without_retries(self.task_id):
            document = RangesDocument.parse(value)
        if (document.stream, document.cursor_id) != (self.stream, self.cursor_id):
            self.log.warning(
                "the run's state holds ranges of stream %r, cursor %r, not %r, %r: freezing again",
                document.stream,
                document.cursor_id,
                self.stream,
                self.cursor_id,
            )
            return None
        self.log.info("reusing the ranges frozen earlier in this run (state key %r)", STATE_KEY)
        self._log_ranges(document)
        return document.to_json()

    def _freeze(self) -> dict[str, Any]:
        with failing_without_retries(self.task_id):  # as rendered: an XComArg's JSON text, say
            self.start = _rendered_bound(self.start, ("cursor", "earliest", "delta"), "start")
            self.end = _rendered_bound(self.end, ("high_watermark",), "end")
        with self.client() as client:
            interval = self._interval()
            count = len(client.stream_info(self.stream).partitions)
            partitions = check_chosen_partitions(self.partitions, count, self.stream)
            starts = self._starts(partitions)
            ends = None if isinstance(self.end, str) else partition_offsets(self.end, "end")
            cursors = {}
            if self.cursor_id:
                cursors = {p: client.fetch_cursor(self.cursor_id, self.stream, p) for p in partitions}
            # Paused partitions answer too. The leader the brokers agree on: a leader thawed after a failover
            # answers with its old high watermark for a moment, and two runs froze different ends that way.
            infos = {p: client.fetch_partition_metadata(self.stream, p, agreed=True) for p in partitions}
            ranges = [
                self._range(client, infos[p], cursor=cursors.get(p, -1), starts=starts, ends=ends, interval=interval)
                for p in partitions
            ]
        # What the freeze saw committed: the commit's proof that offsets past a high watermark that moved back
        # since (a single replica restarted after a crash) were committed once, so could have been ingested.
        metadata: dict[str, Any] = {FROZEN_HIGH_WATERMARKS: {str(p): info.high_watermark for p, info in infos.items()}}
        if cursors:
            metadata[FROZEN_CURSORS] = {str(p): offset for p, offset in cursors.items()}
            metadata[CURSOR_LAG] = self._report_lag(infos, cursors)
        if interval != (None, None):
            metadata[INTERVAL] = {k: t.isoformat() for k, t in zip(("start", "end"), interval, strict=True) if t}
        document = RangesDocument(self.stream, tuple(ranges), self.cursor_id, metadata)
        self._log_ranges(document)
        return document.to_json()

    def _interval(self) -> tuple[datetime | None, datetime | None]:
        """``(start_time, end_time)`` parsed (bad ones fail without retries); an end still to come is retried."""
        start = None if self.start_time is None else parse_instant(self.start_time, "start_time")
        end = None if self.end_time is None else parse_instant(self.end_time, "end_time")
        if start is not None and end is not None and end < start:
            raise InvalidArgumentError(f"end_time {end.isoformat()} is before start_time {start.isoformat()}")
        if end is not None and end > datetime.now(UTC):
            raise AirflowException(f"end_time {end.isoformat()} is still to come: the interval is not over yet")
        return start, end

    def _report_lag(self, infos: Mapping[int, PartitionInfo], cursors: Mapping[int, int]) -> dict[str, int]:
        """``{partition: lag}`` of the cursor, also sent as the ``liftbridge.cursor_lag`` gauge."""
        assert self.cursor_id is not None
        lags = {}
        for partition, cursor in cursors.items():
            lag = telemetry.cursor_lag(infos[partition].high_watermark, cursor)
            telemetry.gauge(
                telemetry.CURSOR_LAG, lag, stream=self.stream, partition=partition, cursor_id=self.cursor_id
            )
            lags[str(partition)] = lag
        return lags

    def _log_ranges(self, document: RangesDocument) -> None:
        for r in document.ranges:
            self.log.info("partition %d: [%d, %d) = %d offsets", r.partition, r.start, r.end, r.count)

    def _range(
        self,
        client: LiftbridgeClient,
        info: PartitionInfo,
        *,
        cursor: int,
        starts: dict[int, int] | None,
        ends: dict[int, int] | None,
        interval: tuple[datetime | None, datetime | None],
    ) -> OffsetRange:
        partition, (start_time, end_time) = info.id, interval
        if end_time is not None:
            end = client.offset_at_time(self.stream, partition, end_time)
        else:
            end = info.high_watermark + 1 if ends is None else self._given(ends, partition, "end")
        if start_time is not None:
            return self._range_from_time(client, info, start_time, end)
        if starts is not None and (partition in starts or self.start != "delta"):
            start = self._given(starts, partition, "start")
        elif self.start == "cursor":
            start = cursor + 1
        elif info.high_watermark < 0:
            start = 0  # never held a message
        else:
            start = self._earliest(client, partition, info.paused) or 0
        if start < end and self.start != "earliest":  # a start taken from earliest_offset is retained
            start = self._retained_start(client, OffsetRange(partition, start, end), info.paused)
        end = max(end, start) if ends is None else end
        if self.max_messages_per_partition is not None:
            end = min(end, start + self.max_messages_per_partition)
        if end < start:
            raise AirflowFailException(f"partition {partition}: end {end} is before start {start}")
        return OffsetRange(partition, start, end)

    def _starts(self, partitions: list[int]) -> dict[int, int] | None:
        """Given start offsets: the mapping, or what the Delta table holds (partitions it lacks: earliest)."""
        if self.start == "delta":
            assert self.delta_table is not None
            with failing_without_retries(self.task_id):
                options = aws_s3_settings(self.aws_conn_id).delta_storage_options() if self.aws_conn_id else None
                held = table_offsets(self.delta_table, self.stream, partitions, options)
            self.log.info("Delta table %s holds next offsets %s", self.delta_table, held)
            return held
        return None if isinstance(self.start, str) else partition_offsets(self.start, "start")

    def _given(self, offsets: dict[int, int], partition: int, what: str) -> int:
        if partition not in offsets:
            raise AirflowFailException(f"{what} offsets {offsets} give nothing for partition {partition}")
        return offsets[partition]

    def _earliest(self, client: LiftbridgeClient, partition: int, paused: bool) -> int | None:
        """The oldest retained offset; only asked for a non-empty range, so a paused partition is resumed."""
        if not paused:
            with contextlib.suppress(PartitionPausedError):  # unless it paused since its metadata was read
                return client.earliest_offset(self.stream, partition)
        return client.earliest_offset(self.stream, partition, resume=True)

    def _range_from_time(
        self, client: LiftbridgeClient, info: PartitionInfo, start_time: datetime, end: int
    ) -> OffsetRange:
        """``[first offset at or after start_time, end)``; one that begins at the oldest retained offset may
        have lost messages to retention (``on_data_loss`` decides)."""
        partition = info.id
        offset_range = OffsetRange(partition, min(client.offset_at_time(self.stream, partition, start_time), end), end)
        if info.high_watermark < 0:
            return offset_range
        lost = interval_start_may_be_lost(
            offset_range,
            self._earliest(client, partition, info.paused),
            compacted=self.compacted,
            start_time=StartPosition.at_time(start_time).timestamp,
            latest_received=info.messages_received.latest,
        )
        if lost:
            message = (
                f"partition {partition}: the interval starts at offset {offset_range.start}, the oldest one "
                "retention kept: messages of the interval before it may have been removed"
            )
            if self.on_data_loss == "fail":
                raise AirflowFailException(message + " (on_data_loss='fail'; set 'skip' to ingest what is left)")
            self.log.warning("%s (on_data_loss='skip')", message)
        return offset_range

    def _retained_start(self, client: LiftbridgeClient, offset_range: OffsetRange, paused: bool) -> int:
        """The range's start, or the oldest retained offset after retention loss with ``on_data_loss="skip"``."""
        partition, start = offset_range.partition, offset_range.start
        earliest = self._earliest(client, partition, paused)
        if self.compacted and earliest is not None and earliest > start:
            gone = min(earliest, offset_range.end)
            self.log.info(
                "partition %d: %d offset(s) at the head (%d-%d) are gone; compacted=True: compaction gaps, not loss",
                partition,
                gone - start,
                start,
                gone - 1,
            )
        check = check_retention(offset_range, earliest, compacted=self.compacted)
        if check.lost is None:
            return start
        first, stop = check.lost
        message = f"partition {partition}: offsets {first}-{stop - 1} were already removed by retention"
        if self.on_data_loss == "fail":
            raise AirflowFailException(
                message + " (on_data_loss='fail'; set 'skip' to start at the oldest one, or compacted=True "
                "if the stream is compacted)"
            )
        self.log.warning("%s; starting at %d (on_data_loss='skip')", message, check.readable.start)
        return check.readable.start


def _rendered_bound(value: Any, keywords: tuple[str, ...], what: str) -> Any:
    """``start``/``end`` as rendered: text is the keyword it names (spaces around it allowed) or
    ``{partition: offset}`` JSON (what an upstream task's XCom renders to); a mapping stays as it is."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text in keywords:
        return text
    try:
        return partition_offsets(text, what)
    except InvalidArgumentError:
        allowed = ", ".join(repr(k) for k in keywords)
        raise InvalidArgumentError(
            f"{what} must be {allowed} or {{partition: offset}} (a mapping or its JSON text), got {value!r}"
        ) from None
