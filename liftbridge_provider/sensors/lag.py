"""LiftbridgeCursorLagSensor: wait until a cursor is at most N offsets behind the high watermark."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from liftbridge_provider import telemetry
from liftbridge_provider.client import InvalidArgumentError
from liftbridge_provider.core.checks import rendered_int
from liftbridge_provider.core.ranges import check_chosen, check_partitions
from liftbridge_provider.hooks.liftbridge import LiftbridgeHook
from liftbridge_provider.operators._base import failing_without_retries


class LiftbridgeCursorLagSensor(BaseSensorOperator):
    """Wait until ``cursor_id`` is at most ``max_lag`` offsets behind the high watermark on every partition.

    Useful to hold a downstream DAG until ingestion has caught up. The lag of a
    partition is its committed high watermark minus the cursor (the last offset
    processed; -1 when never set), never below 0. Each poke sends the gauge
    ``liftbridge.cursor_lag`` (tags stream, partition, cursor_id) and, when done,
    pushes ``{partition: lag}`` to XCom. Paused partitions are read without
    being resumed. A missing stream or partition fails without retries.

    :param stream: stream name.
    :param cursor_id: the cursor to watch.
    :param max_lag: offsets the cursor may be behind, >= 0 (default 0: caught up).
    :param partitions: partitions to check (default: all).
    :param liftbridge_conn_id: the ``liftbridge`` connection.
    """

    template_fields = ("liftbridge_conn_id", "stream", "cursor_id", "max_lag")

    def __init__(
        self,
        *,
        stream: str,
        cursor_id: str,
        max_lag: int = 0,
        partitions: Sequence[int] | None = None,
        liftbridge_conn_id: str = LiftbridgeHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.cursor_id = cursor_id
        self.max_lag: int | str = max_lag  # a template renders to text
        self.partitions = partitions
        self.liftbridge_conn_id = liftbridge_conn_id

    @cached_property
    def hook(self) -> LiftbridgeHook:
        return LiftbridgeHook(liftbridge_conn_id=self.liftbridge_conn_id)

    def poke(self, context: Any) -> PokeReturnValue:
        with failing_without_retries(self.task_id):
            max_lag = self._max_lag()
            check_chosen(self.partitions, self.stream)
            client = self.hook.get_conn()
            count = len(client.stream_info(self.stream).partitions)
            lags = {}
            for partition in check_partitions(self.partitions, count, self.stream):
                cursor = client.fetch_cursor(self.cursor_id, self.stream, partition)
                high_watermark = client.fetch_partition_metadata(self.stream, partition).high_watermark
                lag = telemetry.cursor_lag(high_watermark, cursor)
                telemetry.gauge(
                    telemetry.CURSOR_LAG, lag, stream=self.stream, partition=partition, cursor_id=self.cursor_id
                )
                lags[str(partition)] = lag
        behind = {p: lag for p, lag in lags.items() if lag > max_lag}
        if behind:
            self.log.info(
                "cursor %r of %s is behind by %s (at most %d allowed)", self.cursor_id, self.stream, behind, max_lag
            )
        return PokeReturnValue(is_done=not behind, xcom_value=lags)

    def _max_lag(self) -> int:
        value = rendered_int(self.max_lag)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidArgumentError(f"max_lag must be a whole number of offsets >= 0, got {value!r}")
        return value
