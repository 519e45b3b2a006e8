"""Fault points do nothing unless a test arms them, and do exactly what they were armed with."""

from __future__ import annotations

import pytest

from liftbridge_provider import fault_points


def test_an_unarmed_point_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fault_points.ENV, raising=False)
    fault_points.reached("ingest.claimed")  # returns: nothing armed


def test_an_armed_point_runs_its_action_only_inside_the_block() -> None:
    seen: list[str] = []
    with fault_points.armed("ingest.staged", seen.append):
        fault_points.reached("ingest.claimed")
        fault_points.reached("ingest.staged")
    fault_points.reached("ingest.staged")
    assert seen == ["ingest.staged"]


def test_a_point_cannot_be_armed_twice_at_once() -> None:
    with (
        fault_points.armed("p", lambda _: None),
        pytest.raises(RuntimeError, match="armed already"),
        fault_points.armed("p", lambda _: None),
    ):
        pass


@pytest.mark.parametrize("spec", ["ingest.claimed", "=exit", "x=explode"])
def test_a_malformed_environment_value_is_refused_naming_the_item(spec: str) -> None:
    with pytest.raises(ValueError, match="name=action"):
        fault_points.parse(spec)


def test_the_environment_arms_a_point_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """The way spark-submit crash tests arm a child process: only the named point runs the named action."""
    seen: list[str] = []
    monkeypatch.setitem(fault_points.ACTIONS, "exit", seen.append)
    monkeypatch.setenv(fault_points.ENV, "ingest.claimed=kill-group, ingest.staged=exit")
    fault_points.reached("ingest.decided")
    fault_points.reached("ingest.staged")
    assert seen == ["ingest.staged"]
