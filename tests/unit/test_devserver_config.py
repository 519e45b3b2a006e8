"""Pure pieces of the launcher: version rules and config rendering."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from liftbridge_provider.devserver import binaries, config


@pytest.mark.parametrize(
    ("version", "expected"),
    [("v1.9.0", False), ("v1.8.1", False), ("dev", True), ("v26.01.1", True), ("v2.0.0", True)],
)
def test_telemetry_setting_only_for_servers_that_have_it(version: str, expected: bool) -> None:
    assert binaries.has_telemetry(version) is expected


def settings(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "server_id": "n1",
        "namespace": "ns",
        "port": 4000,
        "data_dir": Path("/tmp/x"),
        "nats_url": "nats://127.0.0.1:5000",
        "seed": True,
        "cursor_partitions": 2,
        "telemetry_setting": False,
    }
    return config.liftbridge_settings(**{**base, **overrides})  # type: ignore[arg-type]


def test_settings_are_loopback_with_cursors_and_activity() -> None:
    values = settings()
    assert values["listen"] == "127.0.0.1:4000"
    assert values["cursors.stream.partitions"] == 2
    assert values["activity.stream.enabled"] is True
    assert values["clustering.raft.bootstrap.seed"] is True
    assert "telemetry.enabled" not in values


def test_newer_servers_get_telemetry_turned_off() -> None:
    assert settings(telemetry_setting=True)["telemetry.enabled"] is False


def test_extra_settings_override_defaults() -> None:
    values = settings(extra={"logging.level": "debug", "tls.cert": "/c.pem"})
    assert values["logging.level"] == "debug"
    assert values["tls.cert"] == "/c.pem"


def test_yaml_is_flat_json_values() -> None:
    text = config.render_yaml({"listen": "127.0.0.1:1", "nats.servers": ["nats://127.0.0.1:2"], "x": True})
    assert text == 'listen: "127.0.0.1:1"\nnats.servers: ["nats://127.0.0.1:2"]\nx: true\n'


def test_nats_conf_binds_loopback() -> None:
    assert config.render_nats_conf(4222) == "host: 127.0.0.1\nport: 4222\n"


def test_free_port_is_bindable() -> None:
    port = config.free_port()
    assert 1024 < port < 65536
    with socket.socket() as probe:
        probe.bind((config.LOOPBACK, port))


def test_free_port_lies_outside_the_ephemeral_range_outgoing_connections_draw_from() -> None:
    """A port from the kernel's ephemeral range can become the source port of any outgoing connection between
    the moment it is chosen and the moment the server binds it (an `airflow standalone` API server lost its
    port that way and every task of the run failed); ports below that range are only ever taken by listeners."""
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = {config.free_port() for _ in range(50)}
    assert all(1024 < port < low or port > high for port in ports), sorted(ports)
    assert len(ports) > 40, "chosen at random, so concurrent test workers do not pick the same one"


def test_free_port_skips_a_port_that_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port some listener holds is not handed out: the first random pick is the taken one."""
    with socket.socket() as taken:
        taken.bind((config.LOOPBACK, 0))
        taken.listen()
        taken_port = taken.getsockname()[1]
        real_randint = random.randint
        picked: list[int] = []

        def first_the_taken_one(low: int, high: int) -> int:
            picked.append(taken_port if not picked else real_randint(low, high))
            return picked[-1]

        monkeypatch.setattr(random, "randint", first_the_taken_one)
        assert config.free_port() != taken_port
        assert picked[0] == taken_port, picked
        assert len(picked) >= 2, picked
