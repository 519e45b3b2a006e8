"""LiftbridgeMessageTrigger: start DAG runs when data lands in a Liftbridge stream (Airflow 3 assets).

Use it in an ``AssetWatcher``, directly or through the common messaging
``MessageQueueTrigger(scheme="liftbridge", ...)``::

    Asset("liftbridge://127.0.0.1:9292/orders", watchers=[
        AssetWatcher(name="orders", trigger=LiftbridgeMessageTrigger(stream="orders", mode="batch")),
    ])

On Airflow 3.3+ all watchers in a triggerer with the same reader settings
share one reader (see :meth:`shared_stream_key`); each applies its own
``value_format`` and ``apply_function``. Delivery and restarts are described
in :mod:`liftbridge_provider.triggers.watchers`. Older Airflow runs each
watcher on its own (:meth:`run`), with the same delivery promise
(:mod:`liftbridge_provider.triggers.handover`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from functools import cached_property
from typing import Any, NamedTuple

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from liftbridge_provider.client import InvalidArgumentError, Message
from liftbridge_provider.client.activity import ACTIVITY_STREAM
from liftbridge_provider.core.functions import import_function
from liftbridge_provider.core.watching import VALUE_FORMATS, WatchSettings, check_payload, message_payload
from liftbridge_provider.hooks.liftbridge import LiftbridgeHook
from liftbridge_provider.triggers.activity import activity_payload, check_activity_ops
from liftbridge_provider.triggers.handover import handover_reader_for
from liftbridge_provider.triggers.watchers import WatcherError, reader_for, record_refusal
from liftbridge_provider.version_compat import (
    AdvanceItem,
    AdvanceOutcome,
    SharedStreamProducer,
    reject_shared_stream_event,
)

PayloadFunction = Callable[[dict[str, Any]], "dict[str, Any] | None"]


class Refusal(NamedTuple):
    """A message the watcher refused, and why."""

    message: Message
    error: Exception


class LiftbridgeMessageTrigger(BaseEventTrigger):
    """Fires asset events for messages of a stream: one per message, or one per batch of frozen ranges.

    Message mode payload: ``stream``, ``partition``, ``offset``, ``key``, ``value``,
    ``headers`` (text, or base64 per the ``*_encoding`` fields), ``timestamp`` (ns).
    Batch mode payload: a ranges document (``liftbridge_provider.core.ranges``) with
    ``metadata.batch`` (its number) and ``metadata.offsets``; ingest it with
    ``spark_jobs/ingest.py``.

    :param stream: the stream.
    :param partitions: partitions to watch (default: all).
    :param liftbridge_conn_id: the ``liftbridge`` connection (default ``liftbridge_default``).
    :param cursor_id: the cursor holding the watcher's position (default ``airflow-<mode>-watcher``).
    :param mode: ``message`` (default) or ``batch``.
    :param start_from: with no stored position, ``earliest`` (default) or ``latest``.
    :param value_format: message mode: ``text`` (UTF-8, base64 when not UTF-8; default) or ``base64``;
        ``activity`` for ``stream="__activity"``: the payload's ``activity`` is the decoded change.
    :param activity_ops: with ``value_format="activity"``: only these changes fire events (e.g.
        ``["create_stream"]``; default all), the others pass without an event.
    :param apply_function: message mode: dotted path to ``f(payload) -> payload | None``,
        run in the triggerer; None skips the message. A function that raises, or returns
        something other than a dict of JSON values or None, refuses the message.
    :param dlq_stream: message mode: stream that refused messages are published to (created
        if missing) before the cursor passes them; without it a refused message stops the
        watcher with its offset and error (default None).
    :param max_in_flight: message mode: events per partition not yet stored by Airflow (default 1).
    :param max_messages: batch mode: offsets that fire a batch (default 1000).
    :param max_wait: batch mode: seconds after which a non-empty batch fires (default 60).
    :param poll_interval: batch mode: seconds between checks, from 0.1 to 1e9 (default 2).
    """

    def __init__(
        self,
        *,
        stream: str,
        partitions: Sequence[int] | None = None,
        liftbridge_conn_id: str = LiftbridgeHook.default_conn_name,
        cursor_id: str | None = None,
        mode: str = "message",
        start_from: str = "earliest",
        value_format: str = "text",
        activity_ops: Sequence[str] | None = None,
        apply_function: str | None = None,
        max_in_flight: int = 1,
        max_messages: int = 1000,
        max_wait: float = 60.0,
        poll_interval: float = 2.0,
        dlq_stream: str | None = None,
    ) -> None:
        super().__init__()
        self.settings = WatchSettings(
            stream=stream,
            partitions=tuple(partitions) if partitions is not None else None,
            liftbridge_conn_id=liftbridge_conn_id,
            cursor_id=cursor_id,
            mode=mode,
            start_from=start_from,
            max_in_flight=max_in_flight,
            max_messages=max_messages,
            max_wait=max_wait,
            poll_interval=poll_interval,
            dlq_stream=dlq_stream,
        )
        if value_format not in VALUE_FORMATS:
            raise InvalidArgumentError(f"value_format must be one of {', '.join(VALUE_FORMATS)}; got {value_format!r}")
        if apply_function is not None and (not isinstance(apply_function, str) or "." not in apply_function):
            raise InvalidArgumentError(
                f"apply_function must be a dotted path such as 'pkg.mod.fn', got {apply_function!r}"
            )
        if value_format == "activity" and (stream != ACTIVITY_STREAM or mode != "message"):
            raise InvalidArgumentError(f"value_format='activity' reads stream {ACTIVITY_STREAM!r} in message mode")
        if activity_ops is not None and value_format != "activity":
            raise InvalidArgumentError("activity_ops filters the activity stream: give value_format='activity'")
        self.activity_ops = check_activity_ops(activity_ops)
        if mode == "batch" and apply_function is not None:
            raise InvalidArgumentError("apply_function works on single messages; it cannot be used with mode='batch'")
        self.value_format = value_format
        self.apply_function = apply_function

    def serialize(self) -> tuple[str, dict[str, Any]]:
        s = self.settings
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "stream": s.stream,
                "partitions": list(s.partitions) if s.partitions is not None else None,
                "liftbridge_conn_id": s.liftbridge_conn_id,
                "cursor_id": s.cursor,
                "mode": s.mode,
                "start_from": s.start_from,
                "value_format": self.value_format,
                "activity_ops": list(self.activity_ops) if self.activity_ops is not None else None,
                "apply_function": self.apply_function,
                "max_in_flight": s.max_in_flight,
                "max_messages": s.max_messages,
                "max_wait": s.max_wait,
                "poll_interval": s.poll_interval,
                "dlq_stream": s.dlq_stream,
            },
        )

    def shared_stream_key(self) -> Hashable:
        """Connection, stream, partitions, cursor and reader settings: equal keys share one reader."""
        return self.settings.group_key()

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return reader_for(cls(**kwargs).settings)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for raw in shared_stream:
            payload = self._event_payload(raw)
            if isinstance(payload, Refusal):
                reject_shared_stream_event()
                self._stop_unless_dead_lettered(payload)
            elif payload is not None:
                yield TriggerEvent(payload)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Without shared streams (Airflow < 3.3): one event per run, its offset passed by the next run once
        Airflow stored it (:mod:`liftbridge_provider.triggers.handover`). Messages before it that fire no
        event (filtered out, or refused and dead-lettered) are passed at once."""
        reader = handover_reader_for(self.settings)
        try:
            async for raw, broker_payload in reader.open_stream():
                payload = self._event_payload(raw)
                if isinstance(payload, Refusal):
                    await reader.advance([AdvanceItem(broker_payload, AdvanceOutcome(acked=0, failed=0, rejected=1))])
                    self._stop_unless_dead_lettered(payload)
                    continue
                if payload is None:
                    await reader.advance([AdvanceItem(broker_payload, AdvanceOutcome(acked=1, failed=0))])
                    continue
                await reader.handing(broker_payload)
                yield TriggerEvent(payload)
                await reader.handed(broker_payload)  # the triggerer took the event: its run ends here
                return
        finally:
            await reader.aclose()

    def _event_payload(self, raw: Any) -> dict[str, Any] | Refusal | None:
        """The event payload of a raw event; a message it cannot be made of is refused (noted for the reader).
        An ``apply_function`` that cannot be imported fails the watcher (InvalidArgumentError), not a message."""
        if self.apply_function is not None:
            self._function  # noqa: B018 - imported here, outside the refusal below
        try:
            return self._payload(raw)
        except Exception as exc:
            if not isinstance(raw, Message):
                raise
            record_refusal(self.settings, raw.partition, raw.offset, f"{type(exc).__name__}: {exc}")
            return Refusal(raw, exc)

    def _payload(self, raw: Any) -> dict[str, Any] | None:
        if not isinstance(raw, Message):
            return dict(raw)  # a batch document
        if self.value_format == "activity":
            payload = activity_payload(raw, self.activity_ops)
            if payload is None:
                return None  # a change the watcher does not fire for
        else:
            payload = message_payload(raw, self.value_format)
        if self.apply_function is not None:
            return check_payload(self._function(payload), self.apply_function)
        return payload

    def _stop_unless_dead_lettered(self, refusal: Refusal) -> None:
        if self.settings.dlq_stream is not None:
            return
        message, exc = refusal
        raise WatcherError(
            f"{message.stream}/{message.partition} offset {message.offset} was refused by apply_function "
            f"{self.apply_function} ({type(exc).__name__}: {exc}); the watcher stops before it. Set dlq_stream to "
            "publish such messages to a dead-letter stream and go on, or move the cursor past the offset "
            "(docs/events.md, 'Refused messages')"
        ) from exc

    @cached_property
    def _function(self) -> PayloadFunction:
        assert self.apply_function is not None
        return import_function(self.apply_function)
