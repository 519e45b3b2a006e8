"""The ``liftbridge`` scheme for the common messaging provider's ``MessageQueueTrigger``.

Both forms build a :class:`~liftbridge_provider.triggers.message.LiftbridgeMessageTrigger`:

* ``MessageQueueTrigger(scheme="liftbridge", stream="orders", mode="batch")``: the
  keyword arguments are the trigger's;
* ``MessageQueueTrigger(queue="liftbridge://127.0.0.1:9292/orders?mode=batch&max_messages=500")``
  (the URI form, which common-messaging deprecates in favour of ``scheme``): the
  path names the stream, the query gives the trigger's keyword arguments (see
  :func:`queue_kwargs`), and keyword arguments may be added besides. The broker in
  the URI only documents where the stream lives: the trigger connects through its
  ``liftbridge_conn_id`` connection.

Needs ``apache-airflow-providers-common-messaging``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlsplit

from airflow.exceptions import AirflowOptionalProviderFeatureException

from liftbridge_provider.client import InvalidArgumentError

try:
    from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider
except ImportError as exc:  # the common messaging provider is an optional extra
    raise AirflowOptionalProviderFeatureException(exc) from exc

from liftbridge_provider.triggers.message import LiftbridgeMessageTrigger

SCHEME = "liftbridge"
# Query parameters of the URI form, by how their text becomes the trigger's keyword argument.
_TEXT = ("liftbridge_conn_id", "cursor_id", "mode", "start_from", "value_format", "apply_function", "dlq_stream")
_INTEGERS = ("max_in_flight", "max_messages")
_SECONDS = ("max_wait", "poll_interval")
_LISTS = {"partitions": int, "activity_ops": str}


def _number(name: str, text: str, kind: type[int] | type[float]) -> int | float:
    try:
        return kind(text)
    except ValueError:
        raise InvalidArgumentError(f"queue URI parameter {name}={text!r} is not a {kind.__name__}") from None


def queue_kwargs(queue: str, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """The trigger's keyword arguments in a ``liftbridge://[host:port]/<stream>[?name=value&...]`` URI.

    Parameters: ``mode``, ``cursor_id``, ``liftbridge_conn_id``, ``start_from``,
    ``value_format``, ``apply_function``, ``dlq_stream`` (text); ``max_in_flight``,
    ``max_messages`` (whole numbers); ``max_wait``, ``poll_interval`` (seconds);
    ``partitions``, ``activity_ops`` (comma-separated). A parameter also given as
    a keyword argument (``given``), repeated, or unknown is refused.
    """
    parts = urlsplit(queue)
    if parts.scheme != SCHEME:
        raise InvalidArgumentError(f"queue {queue!r} is not a {SCHEME}:// URI")
    stream = parts.path.lstrip("/")
    if not stream or "/" in stream:
        raise InvalidArgumentError(f"queue {queue!r} must name one stream: {SCHEME}://host:port/<stream>")
    kwargs: dict[str, Any] = {"stream": stream}
    for name, text in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query)):
        if name in kwargs:
            raise InvalidArgumentError(f"queue {queue!r} gives {name} twice")
        if name in _TEXT:
            kwargs[name] = text
        elif name in _INTEGERS:
            kwargs[name] = _number(name, text, int)
        elif name in _SECONDS:
            kwargs[name] = _number(name, text, float)
        elif name in _LISTS:
            kind = _LISTS[name]
            kwargs[name] = [_number(name, item, kind) if kind is int else item for item in text.split(",") if item]
        else:
            known = sorted((*_TEXT, *_INTEGERS, *_SECONDS, *_LISTS))
            raise InvalidArgumentError(f"queue {queue!r}: unknown parameter {name!r}; known: {', '.join(known)}")
    both = sorted(set(kwargs) & set(given or {}))
    if both:
        raise InvalidArgumentError(f"queue {queue!r} and the keyword arguments both give {', '.join(both)}")
    return kwargs


class LiftbridgeMessageQueueProvider(BaseMessageQueueProvider):
    """Matches ``scheme="liftbridge"`` and ``queue="liftbridge://..."``; builds a LiftbridgeMessageTrigger."""

    scheme = SCHEME

    def queue_matches(self, queue: str) -> bool:
        return isinstance(queue, str) and queue.startswith(f"{SCHEME}://")

    def trigger_class(self) -> type[LiftbridgeMessageTrigger]:
        return LiftbridgeMessageTrigger

    def trigger_kwargs(self, queue: str, **kwargs: Any) -> dict[str, Any]:
        return queue_kwargs(queue, kwargs)
