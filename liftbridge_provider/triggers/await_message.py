"""LiftbridgeAwaitMessageTrigger: wait, in the triggerer, for a message a function accepts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from liftbridge_provider.client import AsyncLiftbridgeClient, InvalidArgumentError, LiftbridgeError, Message
from liftbridge_provider.client.aio_timeout import within
from liftbridge_provider.client.errors import past_a_readonly_end
from liftbridge_provider.core.functions import import_function
from liftbridge_provider.core.ranges import partition_offsets
from liftbridge_provider.hooks.liftbridge import LiftbridgeHook
from liftbridge_provider.triggers.offset import optional_seconds

READONLY_POLL_INTERVAL = 2.0  # seconds between two high-watermark checks at a readonly partition's end


def matched(function: Callable[..., Any], message: Message, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """What ``function`` returns for ``message`` when it is truthy (the match, which must be JSON), else None."""
    value = function(message, *args, **kwargs)
    if not value:
        return None
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"the function's value for {message.stream}/{message.partition} offset {message.offset} must be "
            f"JSON (it goes to XCom): {exc}"
        ) from exc
    return value


def match_event(message: Message, value: Any) -> dict[str, Any]:
    """The payload of a match: where the message is, and the function's value."""
    return {"stream": message.stream, "partition": message.partition, "offset": message.offset, "value": value}


class LiftbridgeAwaitMessageTrigger(BaseTrigger):
    """Fires with the first message from the given offsets on for which ``apply_function`` returns a truthy value.

    One subscription per partition on the asyncio client, each following its
    leader. The event is ``{"status": "success", "stream", "partition",
    "offset", "value"}`` (``value``: what the function returned, JSON), or
    ``{"status": "timeout"}`` after ``timeout`` seconds, or ``{"status":
    "error", "error": <class name>, "message"}``.

    :param stream: stream name.
    :param start_offsets: ``{partition: first offset to look at}`` (keys may be strings).
    :param apply_function: dotted path of ``f(message, *args, **kwargs)``, importable in the triggerer.
    :param apply_function_args: extra positional arguments (JSON values).
    :param apply_function_kwargs: extra keyword arguments (JSON values).
    :param liftbridge_conn_id: the ``liftbridge`` connection.
    :param timeout: seconds, > 0, after which a timeout event is sent (default: none).
    """

    def __init__(
        self,
        *,
        stream: str,
        start_offsets: Mapping[Any, int],
        apply_function: str,
        apply_function_args: Sequence[Any] | None = None,
        apply_function_kwargs: Mapping[str, Any] | None = None,
        liftbridge_conn_id: str = LiftbridgeHook.default_conn_name,
        timeout: float | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(apply_function, str):
            raise InvalidArgumentError(
                f"apply_function must be a dotted path (the trigger runs in another process), got {apply_function!r}"
            )
        self.stream = stream
        self.start_offsets = partition_offsets(start_offsets, "start_offsets")
        if not self.start_offsets:
            raise InvalidArgumentError("start_offsets must name at least one partition")
        self.apply_function = apply_function
        self.apply_function_args = list(apply_function_args or [])
        self.apply_function_kwargs = dict(apply_function_kwargs or {})
        self.liftbridge_conn_id = liftbridge_conn_id
        self.timeout = optional_seconds(timeout, "timeout")

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "stream": self.stream,
                "start_offsets": {str(p): o for p, o in self.start_offsets.items()},
                "apply_function": self.apply_function,
                "apply_function_args": self.apply_function_args,
                "apply_function_kwargs": self.apply_function_kwargs,
                "liftbridge_conn_id": self.liftbridge_conn_id,
                "timeout": self.timeout,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        client: AsyncLiftbridgeClient | None = None
        try:
            function = import_function(self.apply_function)
            client = await LiftbridgeHook(liftbridge_conn_id=self.liftbridge_conn_id).aget_async_client()
            found = await within(self.timeout, self._first_match(client, function))
            yield TriggerEvent({"status": "success", **found})
        except TimeoutError:
            yield TriggerEvent({"status": "timeout", "after": self.timeout})
        except LiftbridgeError as exc:
            yield TriggerEvent({"status": "error", "error": type(exc).__name__, "message": str(exc)})
        finally:
            if client is not None:
                await client.close()

    async def _first_match(self, client: AsyncLiftbridgeClient, function: Callable[..., Any]) -> dict[str, Any]:
        """Read every partition at once; the first match ends them all."""
        found: asyncio.Queue[dict[str, Any] | BaseException] = asyncio.Queue()

        async def watch(partition: int, start: int) -> None:
            """Read from ``start``; a readonly partition's end (the server ends the subscription there, or
            refuses one past it) is a quiet spell: wait for a new offset, then read on."""
            try:
                while True:
                    try:
                        async for message in client.subscribe(self.stream, partition, start, resume=True):
                            start = message.offset + 1
                            value = matched(function, message, self.apply_function_args, self.apply_function_kwargs)
                            if value is not None:
                                await found.put(match_event(message, value))
                                return
                    except InvalidArgumentError as exc:
                        if not past_a_readonly_end(exc):
                            raise
                    while (await client.fetch_partition_metadata(self.stream, partition)).high_watermark < start:
                        await asyncio.sleep(READONLY_POLL_INTERVAL)
            except BaseException as exc:  # handed to the waiting trigger (cancellation included)
                await found.put(exc)
                raise

        readers = [asyncio.create_task(watch(p, o)) for p, o in self.start_offsets.items()]
        try:
            first = await found.get()
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
        if isinstance(first, BaseException):
            raise first
        return first
