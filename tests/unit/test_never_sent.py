"""What a failed unary call's error says about whether its request left: grpc's own words for a call it failed
because its channel could not connect (the installed grpc's, read here from a real channel to a closed port)
mean nothing was sent, so a call that must know (a create, a single publish) may go to the next broker; every
other failure may have come after sending."""

from __future__ import annotations

import socket
import time

import grpc
import pytest

from liftbridge_provider.client import LiftbridgeError
from liftbridge_provider.client.not_sent import GRPC_NEVER_SENT, Connection, NotSent, never_sent
from liftbridge_provider.client.retry import Deadline, RetryState
from tests.unit.plan_driving import Rpc


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_grpcs_failure_to_connect_is_read_as_nothing_sent() -> None:
    address = f"127.0.0.1:{_closed_port()}"
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/proto.API/FetchMetadata", request_serializer=bytes, response_deserializer=bytes)
        with pytest.raises(grpc.RpcError) as failed:
            call(b"", timeout=5)
    unsent = never_sent(failed.value, address)
    assert isinstance(unsent, NotSent), failed.value.details()
    assert unsent.connection is Connection.REFUSED
    assert unsent.address == address
    assert (failed.value.details() or "<none>") in unsent.details(), "grpc's reason is kept"


@pytest.mark.parametrize(
    ("code", "details"),
    [
        (grpc.StatusCode.UNAVAILABLE, "Socket closed"),  # the connection broke while the call was out
        (grpc.StatusCode.UNAVAILABLE, "Connection reset by peer"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
        (grpc.StatusCode.CANCELLED, "failed to connect to all addresses"),  # the words, but not grpc's code
        (grpc.StatusCode.NOT_FOUND, "no such stream"),
    ],
)
def test_every_other_failure_may_have_come_after_sending(code: grpc.StatusCode, details: str) -> None:
    assert never_sent(Rpc(code, details), "127.0.0.1:1") is None


def test_a_failure_already_known_as_not_sent_is_left_as_it_is() -> None:
    assert never_sent(NotSent("127.0.0.1:1", Connection.SILENT), "127.0.0.1:1") is None


def test_a_connection_wait_the_deadline_cut_short_leaves_the_earlier_error_as_the_last() -> None:
    """Found by CI: a call that kept failing on a broker that refused it (a plaintext client against a TLS
    server, grpc's "Socket closed") ended on an attempt whose connection check got almost no time, and said
    "no answer within 0s" instead of grpc's words, so the connection test lost its hint. A silence given less
    than a fair chance says nothing of the broker: the earlier error stays the call's last."""
    state = RetryState(Deadline(0.5), leader_directed=False)
    refused = never_sent(Rpc(grpc.StatusCode.UNAVAILABLE, GRPC_NEVER_SENT + "; last error: Socket closed"), "a:1")
    assert refused is not None
    state.after_failure(refused)
    cut_short = NotSent("a:1", Connection.SILENT, waited=0.0004)
    assert cut_short.cut_short
    with pytest.raises(LiftbridgeError) as ended:
        _fail_until_the_deadline(state, cut_short)
    assert "Socket closed" in str(ended.value), ended.value
    assert "within 0s" not in str(ended.value), ended.value


def test_a_silence_given_a_fair_chance_is_the_last_error() -> None:
    """A broker that stayed silent for a whole connection budget is news: it replaces the earlier error."""
    state = RetryState(Deadline(0.3), leader_directed=False)
    state.after_failure(NotSent("a:1", Connection.REFUSED))
    silent = NotSent("a:1", Connection.SILENT, waited=2.0)
    assert not silent.cut_short
    with pytest.raises(LiftbridgeError) as ended:
        _fail_until_the_deadline(state, silent)
    assert "no answer within 2s" in str(ended.value), ended.value


def _fail_until_the_deadline(state: RetryState, failure: grpc.RpcError) -> None:
    """Tell ``state`` of ``failure`` again after each backoff until it raises (its deadline passed)."""
    for _ in range(1000):
        time.sleep(state.after_failure(failure)[1])
