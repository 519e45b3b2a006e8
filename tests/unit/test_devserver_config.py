"""Pure pieces of the launcher: version rules and config rendering."""

from __future__ import annotations

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
