"""What a publish that got no ack means: may the message be stored, and may it be sent again.

One rule for every path a message takes (unary Publish and PublishToSubject,
the shared PublishAsync streams, the batch over HTTP/2), written once and
driven by each of them. Status codes are given by name (``"UNAVAILABLE"``,
as ``grpc.StatusCode.name``), PublishAsync refusals by their
``PublishAsyncError.Code`` name, so nothing here needs gRPC.

A message that never left the client (no connection, or its request never
written in full) is not stored, and may go again, elsewhere. Once sent, it is
never sent again by the client: it is stored, refused, or unknown, and
``may_be_stored`` says which side of that line a failure is on:

=======================================  =====================  =====================
what happened to a sent message           ack policy LEADER/ALL  ack policy NONE
=======================================  =====================  =====================
acked                                     stored                 (no acks)
refused by the server (PublishAsync       not stored (stored for  the same: the refusal
error, or a unary call's refusal)         PERMISSION_DENIED)      comes before the end
the call ended normally after it          -                      sent (no ack asked)
ack_wait passed, the call broke, the      may be stored          may be stored
deadline or ``close()`` came first
=======================================  =====================  =====================

Under NONE the server answers only refusals, and it answers each before it
reads the next request, so a call it ends normally after the client's end of
stream has answered every refusal of its messages. The refusals of a size or
offset check made by the partition (``TOO_LARGE``, ``INCORRECT_OFFSET``) come
later through NATS and may miss a call that has ended.
"""

from __future__ import annotations

import enum

# A unary call's refusals that the server makes before it hands the message to NATS (server/api.go: the checks
# of publish preconditions, authorization, the ack inbox's subscription, NATS's own refusal of a payload).
_REFUSED_CODES = frozenset({"NOT_FOUND", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "ALREADY_EXISTS"})
_REFUSED_WORDS = (
    "not authorized",  # authorization refused (UNKNOWN: the server returns a plain error)
    "maximum payload exceeded",  # NATS refused the payload before sending it
    "failed to resume stream",  # a paused partition that could not be resumed
    "failed to subscribe to ack inbox",
    "failed to marshal message",
    "failed to publish to nats",  # the NATS client refused the message (closed, bad subject)
    "message larger than max",  # gRPC's own receive limit: the request was not taken
)

ASYNC_REFUSALS: dict[str, tuple[str, bool]] = {
    # PublishAsyncError code: (what the refusal is, may the message be stored anyway?)
    "NOT_FOUND": ("no such stream", False),
    "BAD_REQUEST": ("bad request", False),
    "READONLY": ("readonly partition", False),
    "INCORRECT_OFFSET": ("incorrect offset", False),
    "ENCRYPTION_FAILED": ("encryption failed", False),
    "INTERNAL": ("internal", False),  # the server could not resume, marshal or hand the message to NATS
    # v1.9.0 publishes a message PublishAsync denied anyway (no `continue` after the denial, api.go)
    "PERMISSION_DENIED": ("permission denied", True),
}


def refused_before_publish(code: str, details: str) -> bool:
    """A sent unary publish failed with status ``code`` and ``details`` that say the server refused it before
    handing it on (see the module docstring): nothing was stored."""
    if code in _REFUSED_CODES:
        return True
    lowered = details.lower()
    return any(words in lowered for words in _REFUSED_WORDS)


def may_be_stored_after(code: str, details: str) -> bool:
    """A publish was sent and failed with status ``code`` (its name) and ``details``: may it be stored?

    True unless the server's answer says it refused the message before handing it on. A call that was
    cancelled (``close()``), timed out, lost its connection, or ended with an error of the server's own
    (UNKNOWN, INTERNAL while waiting for the ack) may have been stored, and a retry may store it twice.
    """
    return code != "OK" and not refused_before_publish(code, details)


def async_refusal(code: str) -> tuple[str, bool]:
    """A PublishAsync error response of ``code`` (its name): what it is, and whether the message may be stored
    anyway. The same under every ack policy; an unknown code is a refusal that stored nothing."""
    return ASYNC_REFUSALS.get(code, ("unknown refusal", False))


class Unanswered(enum.Enum):
    """What a message that got no answer is, once its call is over (the table in the module docstring)."""

    NOT_SENT = "not sent"  # never written in full: nothing of it reached the server; it may go again
    SENT = "sent"  # ack policy NONE, and the server ended the call normally after it
    MAY_BE_STORED = "may be stored"  # written, and its fate is unknown


def unanswered(*, written: bool, expects_ack: bool, call_ended_normally: bool) -> Unanswered:
    """The fate of a message that got neither an ack nor a refusal: ``written`` in full on a call, whose ack
    policy ``expects_ack`` (LEADER or ALL), and whose call the server ended normally (after the client's end
    of stream) or not (broken, cut short by a deadline, by ack_wait or by ``close()``)."""
    if not written:
        return Unanswered.NOT_SENT
    if not expects_ack and call_ended_normally:
        return Unanswered.SENT
    return Unanswered.MAY_BE_STORED
