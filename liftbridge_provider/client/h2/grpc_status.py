"""gRPC's status of an HTTP/2 response, stream reset or GOAWAY (gRPC's PROTOCOL-HTTP2.md, "Errors"), and how a
call on the data plane ended (:class:`Ended`, :class:`CallFailed`).

The HTTP/2 itself is h2's (:mod:`~liftbridge_provider.client.h2.call_state`); these are the gRPC-specific facts
on top of it. A call's end reads as grpc's own errors do (``code()``, ``details()``), so the decisions that read
grpc errors (``reading.SubscriptionState``, the publish outcomes) read these the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

import grpc
from h2.errors import ErrorCodes

_STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}

_STATUS_OF_HTTP = {
    400: grpc.StatusCode.INTERNAL,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.UNIMPLEMENTED,
    429: grpc.StatusCode.UNAVAILABLE,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.UNAVAILABLE,
}

_STATUS_OF_RESET: dict[int, grpc.StatusCode] = {
    ErrorCodes.REFUSED_STREAM: grpc.StatusCode.UNAVAILABLE,
    ErrorCodes.CANCEL: grpc.StatusCode.CANCELLED,
    ErrorCodes.ENHANCE_YOUR_CALM: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCodes.INADEQUATE_SECURITY: grpc.StatusCode.PERMISSION_DENIED,
}


@dataclass(frozen=True)
class Ended:
    """How a call ended: ``code`` OK when the server closed it normally; ``details`` as grpc's ``details()``;
    ``goaway``: the server's GOAWAY ended it (grpc's own calls then end UNAVAILABLE, whatever its error code:
    :func:`as_grpc_ends_it`)."""

    code: grpc.StatusCode
    details: str
    goaway: bool = False


class CallFailed(grpc.RpcError):
    """A call that ended with a status other than OK, shaped like grpc's errors (``code()``, ``details()``)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def status_of_number(number: str | None) -> grpc.StatusCode:
    """The status a ``grpc-status`` value names (UNKNOWN for a missing or unknown one)."""
    try:
        return _STATUS_BY_NUMBER.get(int(number or ""), grpc.StatusCode.UNKNOWN)
    except ValueError:
        return grpc.StatusCode.UNKNOWN


def status_of_http(status: str | None) -> grpc.StatusCode:
    """The gRPC status of a response whose HTTP ``:status`` is not 200."""
    try:
        return _STATUS_OF_HTTP.get(int(status or ""), grpc.StatusCode.UNKNOWN)
    except ValueError:
        return grpc.StatusCode.UNKNOWN


def status_of_reset(code: int) -> grpc.StatusCode:
    """The gRPC status of a stream reset (RST_STREAM) or a GOAWAY with HTTP/2 error ``code``."""
    return _STATUS_OF_RESET.get(code, grpc.StatusCode.INTERNAL)


def grpc_message(value: str | None) -> str:
    """A ``grpc-message`` trailer's text (percent-encoded on the wire)."""
    return unquote(value) if value else ""


def grpc_timeout(seconds: float) -> bytes:
    """The ``grpc-timeout`` header's value for ``seconds`` (at least 1 ms; at most eight digits, as gRPC allows):
    the server ends its side of the call when it passes, as grpc's own clients ask it to."""
    milliseconds = max(1, int(seconds * 1000 + 0.999))
    if milliseconds <= 99_999_999:
        return b"%dm" % milliseconds
    return b"%dS" % min(int(seconds + 0.999), 99_999_999)


def as_grpc_ends_it(ended: Ended | None) -> CallFailed | None:
    """A call's end as grpc's own client reports it (None while it runs or when it ended OK): a GOAWAY that ends
    a call ends it UNAVAILABLE in grpc's core (the connection goes away; the call may be tried again), where
    gRPC's HTTP/2 mapping of its error code would say, for ENHANCE_YOUR_CALM, RESOURCE_EXHAUSTED. The readers
    (Subscribe) use this, so that ``SubscriptionState`` resubscribes as it did on grpc's calls."""
    if ended is None or ended.code is grpc.StatusCode.OK:
        return None
    return CallFailed(grpc.StatusCode.UNAVAILABLE if ended.goaway else ended.code, ended.details)
