"""Real Liftbridge servers on 127.0.0.1 for tests, demos and local development.

Python API::

    from liftbridge_provider.devserver import start_single, start_cluster

    with start_single() as server:          # one node, embedded NATS
        print(server.brokers)               # ["127.0.0.1:40123"]

    with start_cluster(size=3) as cluster:  # three nodes on a shared nats-server
        cluster.kill("n2")                  # SIGKILL one node
        cluster.restart("n2")               # same data dir and port; waits until it rejoined
        cluster.freeze("n3")                # SIGSTOP: a peer that vanished without a TCP reset
        cluster.thaw("n3")                  # SIGCONT (stop() thaws every frozen node first)
        cluster.partition_leaders("orders") # {partition: server id of its leader}

An S3-compatible server (Versity's gateway) for object-storage tests and demos:
``liftbridge_provider.devserver.s3.start_s3()``.

Command line: ``python -m liftbridge_provider.devserver start|status|stop``
(``--help`` for options). pytest fixtures: ``liftbridge_provider.devserver.pytest_plugin``.

The servers come from ``.tools/bin`` (``make tools``) or ``LIFTBRIDGE_BIN`` /
``NATS_SERVER_BIN``; they listen on 127.0.0.1 only, and telemetry is turned
off on server versions that have it.
"""

from liftbridge_provider.devserver.cluster import DevServer, Node, start_cluster, start_single
from liftbridge_provider.devserver.errors import DevServerError

__all__ = ["DevServer", "DevServerError", "Node", "start_cluster", "start_single"]
