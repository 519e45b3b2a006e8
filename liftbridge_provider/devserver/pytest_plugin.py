"""pytest fixtures that run real Liftbridge servers.

Enable with ``pytest_plugins = ["liftbridge_provider.devserver.pytest_plugin"]``.

- ``liftbridge_server``: one node with embedded NATS, shared by the session.
- ``liftbridge_cluster``: a fresh three-node cluster per test, for tests that
  kill or restart nodes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from liftbridge_provider.devserver.cluster import DevServer, start_cluster, start_single


@pytest.fixture(scope="session")
def liftbridge_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """A single Liftbridge node for the whole test session."""
    with start_single(data_dir=tmp_path_factory.mktemp("liftbridge-single")) as server:
        yield server


@pytest.fixture
def liftbridge_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """A three-node Liftbridge cluster for one test (fast failover settings)."""
    with start_cluster(size=3, data_dir=tmp_path_factory.mktemp("liftbridge-cluster")) as cluster:
        yield cluster
