"""The broker health model: what a silent, broken, refusing or answering broker changes in the order every
path tries brokers in."""

from __future__ import annotations

from liftbridge_provider.client.health import SUSPECT_FOR, BrokerHealth, Signal


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_silent_and_broken_brokers_go_last_in_their_own_order_until_they_answer_or_the_time_is_up() -> None:
    clock = Clock()
    health = BrokerHealth(clock)
    brokers = ["a", "b", "c", "d"]
    health.tell("b", Signal.SILENT)
    health.tell("a", Signal.BROKEN)
    assert health.suspects_last(brokers) == ["c", "d", "a", "b"]
    health.tell("b", Signal.ANSWERED)
    assert health.suspects_last(brokers) == ["b", "c", "d", "a"]
    clock.now += SUSPECT_FOR + 0.1
    assert health.suspects_last(brokers) == brokers, "a suspicion ends by itself"
    assert health.suspects() == set()


def test_a_refusal_changes_no_order() -> None:
    """A refused connection costs nothing to find again: each path reads the channel's live state."""
    health = BrokerHealth(Clock())
    health.tell("a", Signal.REFUSED)
    assert health.suspects_last(["a", "b"]) == ["a", "b"]
    assert not health.suspected("a")


def test_answered_is_cheap_when_nothing_is_held_against_a_broker_and_clears_a_suspicion() -> None:
    health = BrokerHealth(Clock())
    health.answered("a")
    assert health.suspects() == set()
    health.tell("a", Signal.SILENT)
    health.answered("a")
    assert not health.suspected("a")


def test_the_first_connection_time_is_kept() -> None:
    health = BrokerHealth(Clock())
    health.note_connect_time("a", 0.004)
    health.note_connect_time("a", 0.5)
    assert health.connect_seconds("a") == 0.004
    assert health.connect_seconds("b") is None
