"""A call that never left the client: how a wait for a broker's connection ended, the error that says nothing was
sent (so another broker may take the call, even one that must never be applied twice), and how grpc's own
words for such a call are read. The unary plans, the shared publish streams and the retry rules share them."""

from __future__ import annotations

from enum import Enum

import grpc

from liftbridge_provider.client.health import silence_counts

CONNECT_TRY = 2.0
"""Seconds a call that must know whether it sent waits for one broker's connection before trying the next.

A broker that refuses fails at once; a frozen one (TCP accepted, no HTTP/2
answer) costs this much. Loopback and LAN connections take milliseconds.
"""


class Connection(Enum):
    """How a wait for a channel's connection ended."""

    READY = "ready"
    REFUSED = "refused"  # refused, unreachable or a failed handshake: an RPC would fail at once
    SILENT = "silent"  # still connecting when the wait ended (a frozen peer, a black hole)


class NotSent(grpc.RpcError):
    """The channel did not connect within the attempt's time: nothing was sent, another broker may take it."""

    def __init__(
        self,
        address: str,
        connection: Connection = Connection.SILENT,
        waited: float | None = None,
        reason: str | None = None,
    ) -> None:
        self.address = address
        self.connection = connection
        self.waited = CONNECT_TRY if waited is None else waited  # seconds the connection was given
        self.reason = reason  # the words of whoever found it (grpc's, say a TLS failure), if any

    @property
    def cut_short(self) -> bool:
        """A silent connection given too little time for its silence to say anything of the broker (the call's
        deadline cut the wait short: :func:`~liftbridge_provider.client.health.silence_counts`); a call that
        ends on it reports the error of an earlier attempt, if any (:meth:`RetryState.after_failure`)."""
        return self.connection is Connection.SILENT and not silence_counts(self.waited)

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        if self.reason:
            return f"could not connect to {self.address}: {self.reason}"
        if self.connection is Connection.REFUSED:
            return f"could not connect to {self.address} (refused or unreachable)"
        return f"could not connect to {self.address} (no answer within {self.waited:.3g}s)"


GRPC_NEVER_SENT = "failed to connect to all addresses"
"""How grpc's own words for a call it failed because its channel could not connect begin (UNAVAILABLE; grpcio
1.66 to 1.85 say so, tests/unit/test_never_sent.py reads the installed one's): the call's request never left."""


def never_sent(exc: grpc.RpcError, address: str) -> NotSent | None:
    """:class:`NotSent` (refused) for a call grpc failed before sending it, because its channel could not
    connect to ``address`` (a broker that went away since the channel's last answer); None for any other
    failure, which may have come after the request was sent."""
    if isinstance(exc, NotSent) or exc.code() is not grpc.StatusCode.UNAVAILABLE:
        return None
    if not (exc.details() or "").startswith(GRPC_NEVER_SENT):
        return None
    return NotSent(address, Connection.REFUSED, reason=exc.details())


CONNECTION_FAILURES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)
"""Codes of a failed call that say nothing of the broker's will (its connection failed, or no answer came in
time): the channel's next call checks the broker first. Any other code is the broker's own answer."""
