"""gRPC's status of an HTTP/2 response, stream reset or GOAWAY (gRPC's PROTOCOL-HTTP2.md, "Errors").

The HTTP/2 itself is h2's (:mod:`h2_call`); these are the gRPC-specific facts on top of it.
"""

from __future__ import annotations

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
