"""What a unary call knows of its broker before it sends, without reading grpc's channel state.

The pool trusts a channel only as far as its broker's answers of the last 2 s (``connections.PROOF_FRESH``);
otherwise it checks the broker with a connection of its own first, and a call grpc failed because its
channel could not connect counts as not sent (``not_sent.never_sent``). A create must then say truthfully that
nothing was applied (``may_be_stored=False``) when its only broker is gone, however recently it answered.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from liftbridge_provider.client import LiftbridgeClient, LiftbridgeError
from liftbridge_provider.client.connections import PROOF_FRESH
from liftbridge_provider.devserver import DevServer, start_single


@pytest.fixture
def node() -> Iterator[DevServer]:
    with start_single() as server:
        yield server


def test_a_create_right_after_its_broker_died_says_nothing_was_applied(node: DevServer) -> None:
    """The channel answered a moment ago (so no check is made before sending), then its broker was SIGKILLed
    (0.3 s before the create, well within PROOF_FRESH): grpc fails the create without sending it, and the
    client must report it as not applied, within its deadline, naming the refused connection."""
    with LiftbridgeClient(node.brokers, request_timeout=3) as client:
        client.fetch_metadata()  # an answer on the channel: it is trusted for the next PROOF_FRESH seconds
        node.kill(node.nodes[0].server_id)
        # Died since the last answer, not at the same instant: the reset has reached the client's connection.
        # (A request written while the connection is still being torn down may have reached the broker as far
        # as the client can tell, and is reported so, truthfully.)
        time.sleep(0.3)
        started = time.monotonic()
        with pytest.raises(LiftbridgeError) as raised:
            client.create_stream("proof-killed", "proof-killed", timeout=2)
        elapsed = time.monotonic() - started
    assert elapsed < PROOF_FRESH + 2, f"the create took {elapsed:.1f}s"
    assert raised.value.may_be_stored is False, raised.value
    assert "may have been created" not in str(raised.value), raised.value
    assert "connect" in str(raised.value), raised.value


def test_a_create_after_an_idle_spell_finds_a_frozen_broker_before_sending(node: DevServer) -> None:
    """The channel answered, then stayed idle past PROOF_FRESH while its broker froze (SIGSTOP: its kernel still
    accepts connections, the grpc connection stays up): the create checks the broker first, finds it silent,
    and reports that nothing was applied; sending it would have left the outcome unknown."""
    with LiftbridgeClient(node.brokers, request_timeout=4) as client:
        client.fetch_metadata()
        time.sleep(PROOF_FRESH + 0.2)
        node.freeze(node.nodes[0].server_id)
        try:
            with pytest.raises(LiftbridgeError) as raised:
                client.create_stream("proof-frozen", "proof-frozen", timeout=3)
        finally:
            node.thaw(node.nodes[0].server_id)
        assert raised.value.may_be_stored is False, raised.value
        assert "may have been created" not in str(raised.value), raised.value
        client.create_stream("proof-frozen", "proof-frozen")  # thawed: nothing was applied, so it is created now
        assert "proof-frozen" in client.fetch_metadata().streams
