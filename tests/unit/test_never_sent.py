"""What a failed unary call's error says about whether its request left: grpc's own words for a call it failed
because its channel could not connect (the installed grpc's, read here from a real channel to a closed port)
mean nothing was sent, so a call that must know (a create, a single publish) may go to the next broker; every
other failure may have come after sending."""

from __future__ import annotations

import socket

import grpc
import pytest

from liftbridge_provider.client.plans import Connection, NotSent, never_sent


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


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
    assert never_sent(_Failed(code, details), "127.0.0.1:1") is None


def test_a_failure_already_known_as_not_sent_is_left_as_it_is() -> None:
    assert never_sent(NotSent("127.0.0.1:1", Connection.SILENT), "127.0.0.1:1") is None
