"""LiftbridgeMessageSensor: wait until a message arrives for which a function returns a truthy value."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any, Literal

from airflow.providers.common.compat.sdk import AirflowException, AirflowFailException, AirflowSensorTimeout, conf
from airflow.sdk import BaseSensorOperator, PokeReturnValue

from liftbridge_provider import telemetry
from liftbridge_provider.client import CursorMovedError, CursorStep, InvalidArgumentError, LiftbridgeClient, Message
from liftbridge_provider.core.functions import import_function
from liftbridge_provider.core.ranges import check_chosen_partitions, check_partitions, partition_offsets
from liftbridge_provider.hooks.liftbridge import LiftbridgeHook
from liftbridge_provider.operators._base import failing_without_retries, run_state
from liftbridge_provider.sensors.offset import PERMANENT_EVENT_ERRORS
from liftbridge_provider.triggers.await_message import LiftbridgeAwaitMessageTrigger, match_event, matched

STATE_KEY = "liftbridge_message_sensor"  # run state (operators._base.run_state): {partition: next offset}


class LiftbridgeMessageSensor(BaseSensorOperator):
    """Wait for a message for which ``apply_function`` returns a truthy value; push that value to XCom.

    Messages are looked at from ``start`` on: ``"latest"`` (default: those that
    arrive after the first poke), ``"cursor"`` (after ``cursor_id``'s stored
    offset) or ``{partition: offset}``. Where it looks is fixed at the first
    poke and kept in the task state store (before Airflow 3.3: the stream's
    cursors), so neither a reschedule nor a retry skips a message. The XCom value is ``{"stream", "partition",
    "offset", "value"}``, ``value`` being what the function returned (JSON).
    With ``commit_cursor`` the cursor is set to the matching offset, unless it
    is already there or past it (it never moves back).

    :param stream: stream name.
    :param apply_function: ``f(message, *args, **kwargs)`` taking a
        :class:`~liftbridge_provider.client.Message`: a dotted path (a callable
        works in poke mode only: the trigger runs in another process).
    :param apply_function_args: extra positional arguments (templated, JSON).
    :param apply_function_kwargs: extra keyword arguments (templated, JSON).
    :param partitions: partitions to watch (default: all).
    :param cursor_id: the cursor for ``start="cursor"`` and ``commit_cursor``.
    :param commit_cursor: set the cursor to the matching offset (default False).
    :param deferrable: wait in the triggerer (default ``[operators] default_deferrable``).
    :param liftbridge_conn_id: the ``liftbridge`` connection.

    Poke mode reads each partition up to its high watermark at every poke;
    deferrable mode holds one subscription per partition in the triggerer. No
    match within ``timeout`` fails the task (AirflowSensorTimeout, no retry).
    """

    template_fields = (
        "liftbridge_conn_id",
        "stream",
        "cursor_id",
        "start",
        "apply_function_args",
        "apply_function_kwargs",
    )

    def __init__(
        self,
        *,
        stream: str,
        apply_function: Callable[..., Any] | str,
        apply_function_args: Sequence[Any] | None = None,
        apply_function_kwargs: Mapping[str, Any] | None = None,
        partitions: Sequence[int] | None = None,
        start: Literal["latest", "cursor"] | Mapping[Any, int] = "latest",
        cursor_id: str | None = None,
        commit_cursor: bool = False,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        liftbridge_conn_id: str = LiftbridgeHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if isinstance(start, str) and start not in ("latest", "cursor"):
            raise ValueError(f"start must be 'latest', 'cursor' or {{partition: offset}}, got {start!r}")
        if (start == "cursor" or commit_cursor) and not cursor_id:
            raise ValueError("start='cursor' and commit_cursor need a cursor_id")
        if deferrable and not isinstance(apply_function, str):
            raise ValueError("a deferrable sensor needs apply_function as a dotted path (the triggerer imports it)")
        if not (isinstance(apply_function, str) or callable(apply_function)):
            raise ValueError(f"apply_function must be a callable or a dotted path, got {apply_function!r}")
        self.stream = stream
        self.apply_function = apply_function
        self.apply_function_args = list(apply_function_args or [])
        self.apply_function_kwargs = dict(apply_function_kwargs or {})
        self.partitions = partitions
        self.start = start
        self.cursor_id = cursor_id
        self.commit_cursor = commit_cursor
        self.deferrable = deferrable
        self.liftbridge_conn_id = liftbridge_conn_id

    @cached_property
    def hook(self) -> LiftbridgeHook:
        return LiftbridgeHook(liftbridge_conn_id=self.liftbridge_conn_id)

    def _function(self) -> Callable[..., Any]:
        if isinstance(self.apply_function, str):
            return import_function(self.apply_function)
        return self.apply_function

    def _positions(self, client: LiftbridgeClient, context: Any) -> dict[int, int]:
        """``{partition: next offset to look at}``: fixed at the first poke, then kept in the run's state."""
        stored = run_state(context, client, self.stream).get(STATE_KEY)
        if stored is not None:
            return partition_offsets(stored, "stored positions")
        count = len(client.stream_info(self.stream).partitions)
        chosen = check_chosen_partitions(self.partitions, count, self.stream)
        if self.start == "latest":
            positions = {p: client.fetch_partition_metadata(self.stream, p).high_watermark + 1 for p in chosen}
        elif self.start == "cursor":
            assert self.cursor_id is not None
            positions = {p: client.fetch_cursor(self.cursor_id, self.stream, p) + 1 for p in chosen}
            for partition, position in positions.items():
                self._gauge_lag(client, partition, position - 1)
        else:  # the mapping's partitions are watched; each must exist, and cover ``partitions`` when given
            given = partition_offsets(self.start, "start")
            check_partitions(sorted(given), count, self.stream)
            uncovered = [p for p in chosen if p not in given] if self.partitions is not None else []
            if uncovered or not given:
                raise InvalidArgumentError(
                    f"start gives no offset for partition(s) {uncovered or chosen} of {self.stream!r}: name each "
                    f"watched partition in start, got {self.start!r:.80}"
                )
            positions = {p: given[p] for p in (chosen if self.partitions is not None else sorted(given))}
        self._keep(context, client, positions)
        return positions

    def _keep(self, context: Any, client: LiftbridgeClient, positions: Mapping[int, int]) -> None:
        run_state(context, client, self.stream).set(STATE_KEY, {str(p): o for p, o in positions.items()})

    def poke(self, context: Any) -> PokeReturnValue:
        with failing_without_retries(self.task_id):
            client = self.hook.get_conn()
            self.hook.report_read(self.stream)
            positions = self._positions(client, context)
            function = self._function()
            for partition, start in positions.items():
                end = client.fetch_partition_metadata(self.stream, partition).high_watermark + 1
                for message in client.read_range(self.stream, partition, start, max(start, end), resume=True):
                    value = matched(function, message, self.apply_function_args, self.apply_function_kwargs)
                    if value is not None:
                        return PokeReturnValue(is_done=True, xcom_value=self._found(client, message, value))
                positions[partition] = max(start, end)
            self._keep(context, client, positions)
        self.log.info("no match yet; looking next from %s", positions)
        return PokeReturnValue(is_done=False)

    def _found(self, client: LiftbridgeClient, message: Message, value: Any) -> dict[str, Any]:
        self.log.info("%s/%d offset %d matched: %r", self.stream, message.partition, message.offset, value)
        if self.commit_cursor:
            self._commit(client, message.partition, message.offset)
        return match_event(message, value)

    def _commit(self, client: LiftbridgeClient, partition: int, offset: int) -> None:
        """Move the cursor to ``offset`` by the cursor-advance rule (never back): a cursor already there or
        past it (someone moved it on since the sensor started) is left alone."""
        assert self.cursor_id is not None
        try:
            move = client.advance_cursor(self.cursor_id, self.stream, partition, offset)
        except CursorMovedError as moved:
            self.log.info("cursor %r is already at %d, past %d: left alone", self.cursor_id, moved.found, offset)
            return
        if move.step is CursorStep.ALREADY_THERE:
            self.log.info("cursor %r is already at %d: left alone", self.cursor_id, offset)
            return
        self._gauge_lag(client, partition, offset)

    def _gauge_lag(self, client: LiftbridgeClient, partition: int, cursor: int) -> None:
        assert self.cursor_id is not None
        high_watermark = client.fetch_partition_metadata(self.stream, partition).high_watermark
        lag = telemetry.cursor_lag(high_watermark, cursor)
        telemetry.gauge(telemetry.CURSOR_LAG, lag, stream=self.stream, partition=partition, cursor_id=self.cursor_id)

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        first = self.poke(context)  # messages already there, and the positions fixed
        if first.is_done:
            return first.xcom_value
        with failing_without_retries(self.task_id):
            positions = self._positions(self.hook.get_conn(), context)
        assert isinstance(self.apply_function, str)
        self.defer(
            trigger=LiftbridgeAwaitMessageTrigger(
                stream=self.stream,
                start_offsets=positions,
                apply_function=self.apply_function,
                apply_function_args=self.apply_function_args,
                apply_function_kwargs=self.apply_function_kwargs,
                liftbridge_conn_id=self.liftbridge_conn_id,
                timeout=self.timeout,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        status = event.get("status")
        if status == "timeout":
            raise AirflowSensorTimeout(f"{self.task_id}: no matching message on {self.stream} within {self.timeout}s")
        if status != "success":
            message = f"{self.task_id}: waiting for a message on {self.stream} failed: {event}"
            if event.get("error") in PERMANENT_EVENT_ERRORS or event.get("error") == "InvalidArgumentError":
                raise AirflowFailException(message)
            raise AirflowException(message)
        if self.commit_cursor:
            with failing_without_retries(self.task_id):
                self._commit(self.hook.get_conn(), event["partition"], event["offset"])
        self.log.info("%s/%d offset %d matched: %r", self.stream, event["partition"], event["offset"], event["value"])
        return {k: event[k] for k in ("stream", "partition", "offset", "value")}
