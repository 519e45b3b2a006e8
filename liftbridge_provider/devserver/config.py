"""Configuration files for development nodes: Liftbridge YAML and embedded-NATS conf.

Liftbridge reads flat dotted keys (``clustering.server.id: n1``). Values are
written as JSON, which YAML reads unchanged, so no YAML library is needed.
Every address is 127.0.0.1: nothing here listens on other interfaces.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from liftbridge_provider.devserver.errors import DevServerError

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
PICKS = 100  # random ports tried, then the kernel chooses one (with PORTS_VARIABLE set: DevServerError)
MIN_SHARE = 100  # the fewest ports a share of a range may hold (share_of)
PORTS_VARIABLE = "LIFTBRIDGE_DEVSERVER_PORTS"  # "LOW-HIGH": the only ports free_port may pick (inclusive)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (callers retry on a clash).

    Chosen at random in ``port_range()``: by default below the kernel's ephemeral range when that range is
    known (Linux). A port the kernel hands out for ``bind(0)`` lies inside it, where any outgoing connection
    on the machine may take it as its source port before the server that was meant to listen on it binds it.
    Below the range only listeners take ports, and a random choice keeps concurrent callers apart. Without
    a known range the kernel chooses. With ``LIFTBRIDGE_DEVSERVER_PORTS`` set, only ports in it are taken,
    and DevServerError is raised when :data:`PICKS` random tries find none free.
    """
    span = port_range()
    if span is not None:
        for _ in range(PICKS):
            port = random.randint(*span)
            if _bindable(port):
                return port
    if os.environ.get(PORTS_VARIABLE):
        raise DevServerError(f"no free port found in {PORTS_VARIABLE}={os.environ[PORTS_VARIABLE]} after {PICKS} tries")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def port_range() -> tuple[int, int] | None:
    """The ports ``free_port`` picks from, both ends included: ``LIFTBRIDGE_DEVSERVER_PORTS`` (``LOW-HIGH``)
    when set, else from 10,000 up to just below the kernel's ephemeral range, or None when that is unknown.

    Raises DevServerError naming the value when the variable is not ``LOW-HIGH`` with
    1024 <= LOW <= HIGH <= 65535.
    """
    value = os.environ.get(PORTS_VARIABLE, "")
    if not value:
        below = _ephemeral_low()
        return (LOWEST_PORT, below - 1) if below > LOWEST_PORT else None
    bounds = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", value, re.ASCII)
    if bounds and 1024 <= int(bounds[1]) <= int(bounds[2]) <= 65535:
        return int(bounds[1]), int(bounds[2])
    raise DevServerError(
        f"{PORTS_VARIABLE}={value!r} is not a port range: give LOW-HIGH with 1024 <= LOW <= HIGH <= 65535"
    )


def share_of(span: tuple[int, int], worker: int, workers: int) -> tuple[int, int] | None:
    """Share ``worker`` (from 0) of ``workers`` equal shares of the ports ``span`` (both ends included), or
    None when a share would hold fewer than :data:`MIN_SHARE` ports. Concurrent test processes given their
    own shares never pick the same port: a server stopped or restarting leaves its port free for a while,
    and another process could otherwise start a server on it meanwhile."""
    size = (span[1] - span[0] + 1) // workers if workers > 0 else 0
    if not 0 <= worker < workers or size < MIN_SHARE:
        return None
    low = span[0] + worker * size
    return low, low + size - 1


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
