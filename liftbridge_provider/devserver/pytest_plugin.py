"""pytest fixtures that run real Liftbridge servers.

Enable with ``pytest_plugins = ["liftbridge_provider.devserver.pytest_plugin"]``.

- ``liftbridge_server``: one node with embedded NATS, shared by the session.
- ``liftbridge_cluster``: a fresh three-node cluster per test, for tests that
  kill or restart nodes.

Under pytest-xdist each worker process takes its ports from its own share of
the range (the default one or ``LIFTBRIDGE_DEVSERVER_PORTS``; see
``config.share_of``), which the servers and subprocesses it starts inherit.
Without that, a worker could start a server on the port of another worker's
node while that node was down for a restart, and the node could not come back.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from liftbridge_provider.devserver import config
from liftbridge_provider.devserver.cluster import DevServer, start_cluster, start_single

PORTS = config.PORTS_VARIABLE


def pytest_configure() -> None:
    """In an xdist worker (``PYTEST_XDIST_WORKER`` is ``gw<N>``), keep its ports apart from the others': it
    takes share N (modulo the worker count: a worker that replaces a crashed one counts on) of the range."""
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and workers.isdigit() and int(workers) > 0):
        return
    span = config.port_range()
    share = None if span is None else config.share_of(span, int(worker[2:]) % int(workers), int(workers))
    if share is not None:
        os.environ[PORTS] = f"{share[0]}-{share[1]}"


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
