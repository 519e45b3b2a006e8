"""Consume a stream inside a task: freeze the run's ranges, hand each message (or batch) to a function, commit."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

from airflow.providers.common.compat.sdk import AirflowFailException
from airflow.sdk.module_loading import import_string  # type: ignore[attr-defined]

from liftbridge_provider import telemetry
from liftbridge_provider.client import CursorMovedError, LiftbridgeClient, Message
from liftbridge_provider.client.groups import group_cursor
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument, cap_total, frozen_cursor
from liftbridge_provider.operators._base import failing_without_retries
from liftbridge_provider.operators.ranges import LiftbridgeOffsetRangesOperator

CommitCadence = Literal["end_of_operator", "end_of_batch", "never"]
CADENCES = ("end_of_operator", "end_of_batch", "never")


def _member_id(context: Any) -> str:
    """A consumer id naming the task try (unique across triggerers, retries and mapped copies)."""
    ti = context.get("ti") or context.get("task_instance")
    parts = [getattr(ti, name, None) for name in ("dag_id", "task_id", "run_id", "map_index", "try_number")]
    named = ".".join(str(p) for p in parts if p is not None)
    return f"airflow.{named}.{uuid.uuid4().hex[:8]}" if named else f"airflow.{uuid.uuid4().hex}"


class LiftbridgeConsumeOperator(LiftbridgeOffsetRangesOperator):
    """Read a stream's partitions and call a function per message or per batch; commit the cursor after it.

    The offsets read are frozen once per DAG run, exactly as
    :class:`LiftbridgeOffsetRangesOperator` freezes them (from the cursor,
    earliest, given offsets or times, up to the high watermark at the first
    try; every keyword of that operator applies), and kept in the task state
    store: a retry or a clear of the run reads the same messages, less those a
    batch commit already passed. So a function with side effects sees each
    message once per successful run. The cursor moves only after the function
    succeeded for the messages it passes, by the client's cursor-advance rule
    (``advance_cursors``, each cursor read back after it is written): a cursor
    that someone else moved, or that the commit would move back, fails the
    task without retries.

    :param stream: stream name.
    :param apply_function: called with each :class:`~liftbridge_provider.client.Message`
        (and ``apply_function_args``/``kwargs``); a callable or a dotted path to one.
    :param apply_function_batch: instead, called with a list of up to ``max_batch_size``
        messages of one partition.
    :param apply_function_args: extra positional arguments (templated).
    :param apply_function_kwargs: extra keyword arguments (templated).
    :param cursor_id: the cursor to start from and commit to (needed unless
        ``commit_cadence="never"`` with another ``start``).
    :param commit_cadence: ``"end_of_operator"`` (default: every partition once all
        messages succeeded), ``"end_of_batch"`` (a partition after each batch of
        ``max_batch_size``), or ``"never"``.
    :param max_messages: at most this many messages in all, shared evenly across
        partitions (default: everything up to the high watermark).
    :param max_batch_size: messages per batch, per partition (default 1000).
    :param return_results: push the function's return values to XCom (JSON),
        at most ``max_results`` of them (default 1000; the rest are counted, not kept).
    :param group_id: read as a member of this consumer group: the task joins it, takes
        the partitions the group assigns it once the group settled (``group_settle``
        seconds without a change, default 5), consumes those from the group's
        committed position (cursor ``__group:<group_id>``, shared with any other
        member of the group, Airflow or not), commits there, and leaves. Several
        tasks (e.g. mapped) with one group share a stream's partitions. A retry keeps
        the ranges an earlier try froze only while the group assigns it the same
        partitions; otherwise it freezes them again from the group's cursor. Not with
        ``cursor_id`` or ``partitions``.

    Returns ``{"ranges": [...], "messages": n, "committed": {partition: offset}}``,
    plus ``"results"`` with ``return_results``.

    Lineage: the stream is reported to Airflow's hook lineage as an input that
    carries the offsets this try read, ``[first, last + 1)`` per partition
    (OpenLineage: the ``liftbridge_offsets`` dataset facet), also when the
    function failed part way: a retry that resumes after committed batches
    reports only what it read itself.
    """

    template_fields = (*LiftbridgeOffsetRangesOperator.template_fields, "apply_function_args", "apply_function_kwargs")

    def __init__(
        self,
        *,
        stream: str,
        apply_function: Callable[..., Any] | str | None = None,
        apply_function_batch: Callable[..., Any] | str | None = None,
        apply_function_args: Sequence[Any] | None = None,
        apply_function_kwargs: Mapping[str, Any] | None = None,
        cursor_id: str | None = None,
        commit_cadence: CommitCadence = "end_of_operator",
        max_messages: int | None = None,
        max_batch_size: int = 1000,
        return_results: bool = False,
        max_results: int = 1000,
        group_id: str | None = None,
        group_settle: float = 5.0,
        **kwargs: Any,
    ) -> None:
        if group_id is not None:
            if cursor_id is not None or kwargs.get("partitions") is not None:
                raise ValueError("a group member uses the group's cursor and partitions: no cursor_id or partitions")
            cursor_id = group_cursor(group_id)
        super().__init__(stream=stream, cursor_id=cursor_id, **kwargs)
        if (apply_function is None) == (apply_function_batch is None):
            raise ValueError("give exactly one of apply_function or apply_function_batch")
        if commit_cadence not in CADENCES:
            raise ValueError(f"commit_cadence must be one of {', '.join(CADENCES)}, got {commit_cadence!r}")
        if commit_cadence != "never" and not cursor_id:
            raise ValueError(f"commit_cadence={commit_cadence!r} needs a cursor_id (or commit_cadence='never')")
        for name, value, minimum in (("max_messages", max_messages, 0), ("max_batch_size", max_batch_size, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
                raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
        if isinstance(max_results, bool) or not isinstance(max_results, int) or max_results < 0:
            raise ValueError(f"max_results must be a whole number >= 0, got {max_results!r}")
        self.apply_function = apply_function
        self.apply_function_batch = apply_function_batch
        self.apply_function_args = list(apply_function_args or [])
        self.apply_function_kwargs = dict(apply_function_kwargs or {})
        self.commit_cadence = commit_cadence
        self.max_messages = max_messages
        self.max_batch_size = max_batch_size
        self.return_results = return_results
        self.max_results = max_results
        self.group_id = group_id
        self.group_settle = group_settle

    def _stored_ranges(self, value: Any) -> dict[str, Any] | None:
        """As the base class, and for a group member only while the group still assigns this task the partitions
        an earlier try froze: after a change, the group's other members own some of them (their cursor is the
        group's), so the ranges are frozen again for the partitions assigned now, from the group's cursor."""
        stored = super()._stored_ranges(value)
        if stored is None or self.group_id is None:
            return stored
        frozen = sorted(r.partition for r in RangesDocument.parse(stored).ranges)
        if frozen != sorted(self.partitions or []):
            self.log.warning(
                "group %r now assigns this task partitions %s, not %s as when an earlier try froze its ranges: "
                "freezing again from the group's cursor",
                self.group_id,
                self.partitions,
                frozen,
            )
            return None
        return stored

    def _freeze(self) -> dict[str, Any]:
        document = super()._freeze()
        if self.max_messages is None:
            return document
        capped = cap_total(RangesDocument.parse(document), self.max_messages)
        self.log.info("at most %d messages: %s", self.max_messages, [r.to_json() for r in capped.ranges])
        return capped.to_json()

    def execute(self, context: Any) -> dict[str, Any]:
        if self.group_id is None:
            return self._consume(context)
        with self.client() as client:
            member = client.consumer(self.group_id, _member_id(context), read=False, auto_checkpoint=None,
                                     fetch_assignments_interval=min(1.0, self.group_settle / 2))  # fmt: skip
        try:
            with failing_without_retries(self.task_id):
                member.subscribe([self.stream])
            assigned = member.wait_for_assignments(settle=self.group_settle, timeout=max(60.0, 4 * self.group_settle))
            self.partitions = sorted(p for s, p in assigned if s == self.stream)
            self.log.info("group %r assigned this task partitions %s", self.group_id, self.partitions)
            if not self.partitions:
                return {"ranges": [], "messages": 0, "committed": {}}
            return self._consume(context)
        finally:
            member.close(last_processed=False)  # leaves the group; the cursor was committed by _consume

    def _consume(self, context: Any) -> dict[str, Any]:
        document = RangesDocument.parse(self._run_ranges(context))  # the run's frozen ranges
        function = self._function()
        results: list[Any] = []
        consumed = dropped = 0
        with self.client() as client:
            resumed = {r.partition: self._resume(client, document, r) for r in document.ranges}
            cursors = {p: cursor for p, (_, cursor) in resumed.items()}
            read = {p: OffsetRange(p, first, first) for p, (first, _) in resumed.items()}  # grows as batches come
            try:
                for offset_range in document.ranges:
                    partition, first = offset_range.partition, resumed[offset_range.partition][0]
                    todo = OffsetRange(partition, first, offset_range.end)
                    for batch in self._batches(client, document.stream, todo):
                        read[partition] = OffsetRange(partition, first, batch[-1].offset + 1)
                        returned = self._call(function, batch)
                        consumed += len(batch)
                        if self.return_results:
                            kept = returned[: max(self.max_results - len(results), 0)]
                            results.extend(kept)
                            dropped += len(returned) - len(kept)
                        if self.commit_cadence == "end_of_batch":
                            cursors[partition] = self._commit(
                                client, document.stream, partition, cursors[partition], batch[-1].offset
                            )
            finally:  # a function that failed still read what came before it
                self.hook.report_read(document.stream, ranges=read.values(), cursor_id=self.cursor_id)
            if self.commit_cadence == "end_of_operator":
                cursors = self._commit_all(client, document, cursors)
        if dropped:
            self.log.warning("%d results were not kept (max_results=%d)", dropped, self.max_results)
        committed = {str(p): c for p, c in cursors.items() if c is not None}
        self.log.info("consumed %d message(s); cursor %r at %s", consumed, self.cursor_id, committed)
        output: dict[str, Any] = {"ranges": [r.to_json() for r in document.ranges], "messages": consumed}
        output["committed"] = committed
        if self.return_results:
            output["results"] = results
        return output

    def _function(self) -> Callable[..., Any]:
        function = self.apply_function if self.apply_function is not None else self.apply_function_batch
        if isinstance(function, str):
            try:
                function = import_string(function)
            except ImportError as exc:
                raise AirflowFailException(f"{self.task_id}: cannot import {function!r}: {exc}") from exc
        if not callable(function):
            raise AirflowFailException(f"{self.task_id}: {function!r} is not callable")
        return function

    def _call(self, function: Callable[..., Any], batch: list[Message]) -> list[Any]:
        """Run the function on a batch (per message or at once); its return values."""
        if self.apply_function_batch is not None:
            return [function(batch, *self.apply_function_args, **self.apply_function_kwargs)]
        return [function(message, *self.apply_function_args, **self.apply_function_kwargs) for message in batch]

    def _batches(self, client: LiftbridgeClient, stream: str, offset_range: OffsetRange) -> Iterator[list[Message]]:
        batch: list[Message] = []
        if offset_range.count <= 0:
            return
        for message in client.read_range(
            stream, offset_range.partition, offset_range.start, offset_range.end, resume=True
        ):
            batch.append(message)
            if len(batch) == self.max_batch_size:
                yield batch
                batch = []
        if batch:
            yield batch

    def _resume(
        self, client: LiftbridgeClient, document: RangesDocument, offset_range: OffsetRange
    ) -> tuple[int, int | None]:
        """``(first offset to read, the cursor now)``: the range's start while the cursor is where the freeze
        found it, or after the cursor where an earlier try of this run committed batches of the range; a
        cursor moved anywhere else fails the task (someone else consumes it). No cursor: the start, None."""
        if self.commit_cadence == "never" or not self.cursor_id:
            return offset_range.start, None
        partition = offset_range.partition
        current = client.fetch_cursor(self.cursor_id, document.stream, partition)
        self._gauge_lag(client, document.stream, partition, current)
        frozen = frozen_cursor(document, partition)
        if current == (offset_range.start - 1 if frozen is None else frozen):
            return offset_range.start, current
        if offset_range.start <= current < offset_range.end:
            self.log.info("partition %d: resuming after offset %d, committed by an earlier try", partition, current)
            return current + 1, current
        raise AirflowFailException(
            f"cursor {self.cursor_id!r} of {document.stream!r} partition {partition} is at {current}, neither where "
            f"the freeze found it ({frozen}) nor inside the frozen range [{offset_range.start}, {offset_range.end}): "
            "someone else moved it, so consuming would skip or repeat messages"
        )

    def _commit(self, client: LiftbridgeClient, stream: str, partition: int, expected: int | None, target: int) -> int:
        """Move the cursor from ``expected`` to ``target`` (the cursor-advance rule); returns ``target``."""
        self._advance(client, stream, {partition: target}, {partition: expected})
        self._gauge_lag(client, stream, partition, target)
        return target

    def _commit_all(
        self, client: LiftbridgeClient, document: RangesDocument, cursors: dict[int, int | None]
    ) -> dict[int, int | None]:
        """Every non-empty range's cursor to its last offset, each checked before any moves."""
        targets = {
            r.partition: r.last for r in document.ranges if r.last is not None and r.last != cursors[r.partition]
        }
        self._advance(client, document.stream, targets, {p: cursors[p] for p in targets})
        for partition, target in targets.items():
            self._gauge_lag(client, document.stream, partition, target)
        return {**cursors, **targets}

    def _advance(
        self, client: LiftbridgeClient, stream: str, targets: dict[int, int], expected: dict[int, int | None]
    ) -> None:
        """``advance_cursors`` with a read back; a cursor someone else moved (or overwrote) fails the task."""
        assert self.cursor_id is not None
        try:
            client.advance_cursors(self.cursor_id, stream, targets, expected=expected, verify=True)
        except CursorMovedError as moved:
            if moved.overwritten:
                message = f"{moved}: another writer commits cursor {self.cursor_id!r} too; keep one writer per cursor"
            else:
                message = (
                    f"cursor {self.cursor_id!r} of {stream!r} partition {moved.partition} is at {moved.found}, "
                    f"expected {moved.expected}: someone else moved it; not committing {moved.target} "
                    "(no cursor was moved)"
                )
            raise AirflowFailException(message) from moved

    def _gauge_lag(self, client: LiftbridgeClient, stream: str, partition: int, cursor: int) -> None:
        assert self.cursor_id is not None
        high_watermark = client.fetch_partition_metadata(stream, partition).high_watermark
        lag = telemetry.cursor_lag(high_watermark, cursor)
        telemetry.gauge(telemetry.CURSOR_LAG, lag, stream=stream, partition=partition, cursor_id=self.cursor_id)
