"""LiftbridgeOffsetTrigger: wait, in the triggerer, until partitions reach target offsets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from liftbridge_provider.client import AsyncLiftbridgeClient, InvalidArgumentError, LiftbridgeError
from liftbridge_provider.client.metadata import PartitionInfo
from liftbridge_provider.core.checks import MAX_SECONDS, check_poll_interval, check_timeout
from liftbridge_provider.core.ranges import partition_offsets
from liftbridge_provider.hooks.liftbridge import LiftbridgeHook


def optional_seconds(value: object, name: str) -> float | None:
    """None (no limit), or a number of seconds > 0 and at most :data:`MAX_SECONDS`."""
    try:
        return check_timeout(name, value)
    except InvalidArgumentError:
        raise InvalidArgumentError(
            f"{name} must be None or a number of seconds > 0, got {value!r} (finite, at most {MAX_SECONDS:g})"
        ) from None


def unmet_targets(targets: Mapping[int, int], high_watermarks: Mapping[int, int]) -> dict[int, int]:
    """Partitions whose high watermark is still below its target: ``{partition: missing offsets}``."""
    return {p: t - high_watermarks.get(p, -1) for p, t in targets.items() if high_watermarks.get(p, -1) < t}


def waiting_note(stream: str, targets: Mapping[int, int], infos: Mapping[int, PartitionInfo]) -> str:
    """The log line of a wait: offsets missing per partition, and partitions that hold their target offset
    but have not committed it (their high watermark is below; chaos seed 155)."""
    missing = unmet_targets(targets, {p: info.high_watermark for p, info in infos.items()})
    note = f"{stream}: waiting for {missing} more offset(s) per partition"
    held = [
        f"partition {p} holds offsets up to {infos[p].newest_offset} "
        f"but its high watermark is {infos[p].high_watermark}"
        for p in missing
        if p in infos and infos[p].newest_offset >= targets[p]
    ]
    if held:
        note += (
            f"; {', '.join(held)} (a leader commits offsets as its followers fetch them; a restarted "
            "single-replica leader only with the next message published to the partition)"
        )
    return note


class LiftbridgeOffsetTrigger(BaseTrigger):
    """Fires when every partition's committed high watermark is at least its target offset.

    :param stream: stream name.
    :param targets: ``{partition: offset}``, both >= 0 (keys may be strings, as JSON makes them).
    :param liftbridge_conn_id: the ``liftbridge`` connection.
    :param poll_interval: seconds between checks, from 0.1 to 1e9 (default 5).
    :param timeout: seconds, > 0, after which a timeout event is sent (default: none).

    Bad values raise InvalidArgumentError here, before anything is serialised.
    An error event names the error's class (``"error"``), so the sensor can
    tell a missing stream or partition from a transient failure.
    """

    def __init__(
        self,
        *,
        stream: str,
        targets: Mapping[Any, int],
        liftbridge_conn_id: str = LiftbridgeHook.default_conn_name,
        poll_interval: float = 5.0,
        timeout: float | None = None,
    ) -> None:
        super().__init__()
        self.stream = stream
        self.targets = partition_offsets(targets, "target")
        self.liftbridge_conn_id = liftbridge_conn_id
        self.poll_interval = check_poll_interval("poll_interval", poll_interval)
        self.timeout = optional_seconds(timeout, "timeout")
        self._client: AsyncLiftbridgeClient | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "stream": self.stream,
                "targets": {str(p): t for p, t in self.targets.items()},
                "liftbridge_conn_id": self.liftbridge_conn_id,
                "poll_interval": self.poll_interval,
                "timeout": self.timeout,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        started = time.monotonic()
        try:
            self._client = await LiftbridgeHook(liftbridge_conn_id=self.liftbridge_conn_id).aget_async_client()
            while True:
                infos = {p: await self._client.fetch_partition_metadata(self.stream, p) for p in self.targets}
                high_watermarks = {p: info.high_watermark for p, info in infos.items()}
                missing = unmet_targets(self.targets, high_watermarks)
                if not missing:
                    yield TriggerEvent(
                        {"status": "success", "high_watermarks": {str(p): hw for p, hw in high_watermarks.items()}}
                    )
                    return
                left = None if self.timeout is None else started + self.timeout - time.monotonic()
                if left is not None and left <= 0:
                    missing_offsets = {str(p): n for p, n in missing.items()}
                    note = waiting_note(self.stream, self.targets, infos)
                    yield TriggerEvent({"status": "timeout", "missing": missing_offsets, "note": note})
                    return
                self.log.info("%s", waiting_note(self.stream, self.targets, infos))
                # the timeout is a deadline: the last sleep ends at it, not a poll interval after
                await asyncio.sleep(self.poll_interval if left is None else min(self.poll_interval, left))
        except LiftbridgeError as exc:
            yield TriggerEvent({"status": "error", "error": type(exc).__name__, "message": str(exc)})
        finally:
            await self.cleanup()

    async def cleanup(self) -> None:
        """Close the trigger's channels."""
        if self._client is not None:
            await self._client.close()
            self._client = None
