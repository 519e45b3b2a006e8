"""Fixtures of the server tier (real Liftbridge nodes and clusters, no Airflow or Spark)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from liftbridge_provider.devserver import DevServer, start_single

# Short enough that a member that stopped heartbeating is evicted, and a lost coordinator replaced, within a test.
GROUP_TIMEOUTS = {"groups.consumer.timeout": "3s", "groups.coordinator.timeout": "3s"}


@pytest.fixture(scope="module")
def group_node() -> Iterator[DevServer]:
    """A node of its own per module, with consumer-group timeouts of 3 s."""
    with start_single(extra_config=GROUP_TIMEOUTS) as started:
        yield started
