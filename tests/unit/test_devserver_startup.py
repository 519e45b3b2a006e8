"""How a dev server's start decides between waiting on, starting a cluster anew, and failing (pure logic: the
server is a stand-in that answers readiness checks as told)."""

from __future__ import annotations

import time

import pytest

from liftbridge_provider.devserver.errors import DevServerError
from liftbridge_provider.devserver.startup import Unformed, wait_formed

UNFORMED = "Liftbridge not ready after 45s: 127.0.0.1:21981 knows brokers ['n1', 'n2'], expected 3\n--- n1 ..."
SLOW = "Liftbridge not ready after 45s: 127.0.0.1:21981 has no __cursors stream yet\n--- n1 ..."


class Answers:
    """A server whose wait_ready raises the next of ``errors`` (None: ready), recording each timeout asked."""

    def __init__(self, *errors: str | None) -> None:
        self.errors = list(errors)
        self.timeouts: list[float] = []

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.timeouts.append(timeout)
        error = self.errors.pop(0)
        if error is not None:
            raise DevServerError(error)

    def restart(self, server_id: str, timeout: float = 60.0) -> object:
        raise AssertionError("a cluster start never restarts one node")


def test_a_first_start_that_did_not_form_is_given_half_the_time_then_started_anew() -> None:
    server = Answers(UNFORMED)
    with pytest.raises(Unformed, match=r"knows brokers \['n1', 'n2'\], expected 3"):
        wait_formed(server, time.monotonic() + 90, last_attempt=False)
    assert len(server.timeouts) == 1
    assert 44 < server.timeouts[0] <= 45


def test_a_first_start_that_is_only_slow_waits_the_rest_of_the_time_on_the_same_cluster() -> None:
    server = Answers(SLOW, None)
    wait_formed(server, time.monotonic() + 90, last_attempt=False)
    assert len(server.timeouts) == 2
    assert server.timeouts[1] > 80, "the same cluster, the time left"


def test_the_last_start_gets_all_the_time_left_and_its_failure_is_the_callers() -> None:
    server = Answers(UNFORMED)
    with pytest.raises(DevServerError, match="knows brokers"):
        wait_formed(server, time.monotonic() + 40, last_attempt=True)
    assert len(server.timeouts) == 1
    assert 39 < server.timeouts[0] <= 40


def test_a_ready_first_start_is_returned_at_once() -> None:
    server = Answers(None)
    wait_formed(server, time.monotonic() + 90, last_attempt=False)
    assert len(server.timeouts) == 1
