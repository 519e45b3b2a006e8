"""Configuration files for development nodes: Liftbridge YAML and embedded-NATS conf.

Liftbridge reads flat dotted keys (``clustering.server.id: n1``). Values are
written as JSON, which YAML reads unchanged, so no YAML library is needed.
Every address is 127.0.0.1: nothing here listens on other interfaces.
"""

from __future__ import annotations

import json
import random
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"

# Lowered replica timeouts for multi-node clusters, so a partition leader is
# replaced about a second after it dies (server defaults: 15 s, 10 s, 3 s, 15 s).
FAST_FAILOVER: dict[str, Any] = {
    "clustering.replica.max.leader.timeout": "1s",
    "clustering.replica.max.idle.wait": "500ms",
    "clustering.replica.fetch.timeout": "500ms",
    "clustering.replica.max.lag.time": "3s",
}


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")  # Linux: the source ports of outgoing connections
LOWEST_PORT = 10_000  # ports below this are left to well-known and registered services
PICKS = 100  # random ports tried before falling back to one the kernel chooses


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (callers retry on a clash).

    Chosen at random below the kernel's ephemeral range when that range is known (Linux): a port the kernel
    hands out for ``bind(0)`` lies inside it, where any outgoing connection on the machine may take it as its
    source port before the server that was meant to listen on it binds it. Below the range only listeners
    take ports, and a random choice keeps concurrent callers apart. Elsewhere the kernel chooses.
    """
    below = _ephemeral_low()
    for _ in range(PICKS if below > LOWEST_PORT else 0):
        port = random.randint(LOWEST_PORT, below - 1)
        if _bindable(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range; 0 when it cannot be read."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def liftbridge_settings(
    *,
    server_id: str,
    namespace: str,
    port: int,
    data_dir: Path,
    nats_url: str,
    seed: bool,
    cursor_partitions: int,
    peers: Sequence[str] = (),
    telemetry_setting: bool,
    log_level: str = "info",
    embedded_nats_config: Path | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The settings of one node; ``extra`` entries override the defaults.

    :param seed: bootstrap the Raft group alone (a single node).
    :param peers: server ids that bootstrap the Raft group together (a cluster).
    :param telemetry_setting: write ``telemetry.enabled: false`` (servers newer
        than v1.9 send telemetry by default; v1.9 refuses the key).
    """
    settings: dict[str, Any] = {
        "listen": f"{LOOPBACK}:{port}",
        "data.dir": str(data_dir),
        "logging.level": log_level,
        "clustering.server.id": server_id,
        "clustering.namespace": namespace,
        "nats.servers": [nats_url],
        "cursors.stream.partitions": cursor_partitions,
        "cursors.stream.auto.pause.time": 0,
        "activity.stream.enabled": True,
    }
    if seed:
        settings["clustering.raft.bootstrap.seed"] = True
    if peers:
        settings["clustering.raft.bootstrap.peers"] = list(peers)
    if embedded_nats_config is not None:
        settings["nats.embedded.config"] = str(embedded_nats_config)
    if telemetry_setting:
        settings["telemetry.enabled"] = False
    settings.update(extra or {})
    return settings


def render_yaml(settings: Mapping[str, Any]) -> str:
    """Flat ``key: value`` YAML, one setting per line, values in JSON form."""
    return "".join(f"{key}: {json.dumps(value)}\n" for key, value in settings.items())


def render_nats_conf(port: int, extra: str = "") -> str:
    """Embedded NATS server settings: client port on loopback only, no monitoring; ``extra`` (NATS config text,
    e.g. an ``authorization`` block) appended."""
    return f"host: {LOOPBACK}\nport: {port}\n{extra}"
