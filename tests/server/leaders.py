"""Which node leads what in a test cluster, read from the nodes themselves (helpers of the server tier)."""

from __future__ import annotations

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.devserver.cluster import METADATA_LEADER_LINE


def metadata_leader(cluster: DevServer) -> str:
    """The node that most recently logged becoming metadata leader."""
    newest: tuple[str, str] | None = None
    for node in cluster.nodes:
        lines = [line for line in node.process.log_path.read_text(errors="replace").splitlines()]
        stamps = [line[:40] for line in lines if METADATA_LEADER_LINE in line]
        if stamps and (newest is None or stamps[-1] > newest[0]):
            newest = (stamps[-1], node.server_id)
    assert newest is not None, "no node logged becoming metadata leader"
    return newest[1]


def partition_led_away_from(client: LiftbridgeClient, server_id: str, prefix: str) -> tuple[str, int]:
    """A new stream of three partitions (replication factor 3) and one of its partitions whose leader is not
    ``server_id``; the server places partition leaders by its own load figures, so up to six streams are made."""
    for attempt in range(6):
        name = f"{prefix}-{attempt}"
        client.create_stream(name, name, partitions=3, replication_factor=3)
        leaders = {p: info.leader for p, info in client.stream_info(name).partitions.items()}
        away = [p for p, owner in sorted(leaders.items()) if owner != server_id]
        if away:
            return name, away[0]
    raise AssertionError(f"18 partitions all led by {server_id}")


def settled_without(client: LiftbridgeClient, stream: str, node: str, partition: int = 0) -> bool:
    """The failover away from ``node`` has settled on ``stream``'s partition: the leader more than half of the
    brokers name is another node, and ``node`` is out of its ISR. Until then the leader cannot commit (a dead
    replica in the ISR holds the high watermark), and a report resent to a new metadata leader may move the
    partition again."""
    info = client.fetch_partition_metadata(stream, partition, agreed=True, timeout=3)
    return info.leader not in (None, node) and node not in info.isr


def settled_on_every_partition(client: LiftbridgeClient, stream: str, node: str) -> bool:
    """:func:`settled_without` for each partition of ``stream``."""
    return all(settled_without(client, stream, node, p) for p in client.stream_info(stream).partitions)
