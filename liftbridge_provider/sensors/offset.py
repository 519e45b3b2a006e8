"""LiftbridgePartitionOffsetSensor: wait until partitions reach target offsets (poke or deferrable)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any

from airflow.providers.common.compat.sdk import AirflowException, AirflowFailException, AirflowSensorTimeout, conf
from airflow.sdk import BaseSensorOperator

from liftbridge_provider.client import NoSuchPartitionError, NoSuchStreamError
from liftbridge_provider.core.checks import check_offset, check_poll_interval, rendered_int
from liftbridge_provider.core.ranges import RangesDocument, check_chosen, check_partitions, partition_offsets
from liftbridge_provider.hooks.liftbridge import LiftbridgeHook
from liftbridge_provider.operators._base import failing_without_retries
from liftbridge_provider.triggers.offset import (
    LiftbridgeOffsetTrigger,
    unmet_targets,
    waiting_note,
)

# Trigger error events that no retry can fix (the trigger names the error's class).
PERMANENT_EVENT_ERRORS = {NoSuchStreamError.__name__, NoSuchPartitionError.__name__}


class LiftbridgePartitionOffsetSensor(BaseSensorOperator):
    """Wait until the committed high watermark of partitions reaches target offsets.

    Targets come from exactly one of:

    - ``target_offset`` with ``partitions`` (default: all partitions); a whole number, or the digits a
      template renders;
    - ``target_offsets``: ``{partition: offset}``;
    - ``ranges``: a ranges document; each non-empty range targets ``end - 1``.

    :param stream: stream name (taken from ``ranges`` when given).
    :param deferrable: wait in the triggerer instead of a worker slot (default:
        ``[operators] default_deferrable``).
    :param poll_interval: seconds between checks in deferrable mode, from 0.1 to 1e9 (default: ``poke_interval``).
    :param liftbridge_conn_id: the ``liftbridge`` connection.

    Paused partitions are checked without being resumed. Bad targets and a
    missing stream or partition (also one deleted while the trigger waits)
    fail the task without retries.
    """

    template_fields = ("liftbridge_conn_id", "stream", "target_offset", "target_offsets", "ranges")

    def __init__(
        self,
        *,
        stream: str | None = None,
        partitions: Sequence[int] | None = None,
        target_offset: int | str | None = None,
        target_offsets: Mapping[Any, int] | None = None,
        ranges: RangesDocument | Mapping[str, Any] | str | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float | None = None,
        liftbridge_conn_id: str = LiftbridgeHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if sum(x is not None for x in (target_offset, target_offsets, ranges)) != 1:
            raise ValueError("give exactly one of target_offset, target_offsets or ranges")
        if ranges is None and not stream:
            raise ValueError("stream is required unless ranges are given")
        if poll_interval is not None:
            check_poll_interval("poll_interval", poll_interval)
        self.stream = stream
        self.partitions = partitions
        self.target_offset = target_offset
        self.target_offsets = target_offsets
        self.ranges = ranges
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.liftbridge_conn_id = liftbridge_conn_id

    @cached_property
    def hook(self) -> LiftbridgeHook:
        return LiftbridgeHook(liftbridge_conn_id=self.liftbridge_conn_id)

    def _targets(self) -> tuple[str, dict[int, int]]:
        """The stream and ``{partition: offset}`` to wait for (validated, before anything is sent)."""
        with failing_without_retries(self.task_id):
            if self.ranges is not None:
                document = RangesDocument.parse(self.ranges)
                targets = {r.partition: r.end - 1 for r in document.ranges if r.end > r.start}
                return document.stream, targets
            assert self.stream is not None
            if self.target_offsets is not None:
                return self.stream, partition_offsets(self.target_offsets, "target_offsets")
            target = check_offset(rendered_int(self.target_offset), "target_offset")  # a template renders text
            check_chosen(self.partitions, self.stream)
            count = len(self.hook.get_conn().stream_info(self.stream).partitions)
            chosen = check_partitions(self.partitions, count, self.stream)
            return self.stream, dict.fromkeys(chosen, target)

    def poke(self, context: Any) -> bool:
        stream, targets = self._targets()
        with failing_without_retries(self.task_id):
            client = self.hook.get_conn()
            infos = {p: client.fetch_partition_metadata(stream, p) for p in targets}
        missing = unmet_targets(targets, {p: info.high_watermark for p, info in infos.items()})
        if missing:
            self.log.info("%s", waiting_note(stream, targets, infos))
        return not missing

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        stream, targets = self._targets()
        if not targets:
            self.log.info("nothing to wait for: every range is empty")
            return None
        if self.poke(context):
            return None
        self.defer(
            trigger=LiftbridgeOffsetTrigger(
                stream=stream,
                targets=targets,
                liftbridge_conn_id=self.liftbridge_conn_id,
                poll_interval=self.poll_interval or self.poke_interval,
                timeout=self.timeout,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") != "success":
            message = f"{self.task_id}: waiting for {self.stream or 'the ranges'} failed: {event}"
            if event.get("status") == "timeout":  # as poke and reschedule modes end: no retry
                raise AirflowSensorTimeout(message)
            if event.get("error") in PERMANENT_EVENT_ERRORS:
                raise AirflowFailException(message)
            raise AirflowException(message)
        self.log.info("high watermarks reached: %s", event["high_watermarks"])
        return event
