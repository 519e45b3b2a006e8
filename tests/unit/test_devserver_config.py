"""Pure pieces of the launcher: version rules and config rendering."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

import pytest

from liftbridge_provider.devserver import DevServerError, binaries, config, pytest_plugin


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


def test_free_port_takes_only_ports_of_the_range_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """LIFTBRIDGE_DEVSERVER_PORTS confines the picks (a firewall's open range, or one test process's share)."""
    monkeypatch.setenv(config.PORTS_VARIABLE, "20000-20019")
    ports = {config.free_port() for _ in range(40)}
    assert ports <= set(range(20000, 20020)), sorted(ports)
    assert len(ports) > 5, "still chosen at random inside the range"


def test_a_range_with_no_free_port_is_an_error_not_a_port_outside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind((config.LOOPBACK, 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv(config.PORTS_VARIABLE, f"{port}-{port}")
        with pytest.raises(DevServerError, match=rf"no free port found in {config.PORTS_VARIABLE}={port}-{port}"):
            config.free_port()


@pytest.mark.parametrize(
    "value", ["abc", "20000", "20000-", "-20000", "30000-20000", "80-90", "60000-70000", "1e4-2e4", "2²000-30000"]
)
def test_a_bad_port_range_is_refused_naming_the_value_and_the_form(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(config.PORTS_VARIABLE, value)
    with pytest.raises(DevServerError) as raised:
        config.free_port()
    assert f"{config.PORTS_VARIABLE}={value!r} is not a port range" in str(raised.value)
    assert "LOW-HIGH with 1024 <= LOW <= HIGH <= 65535" in str(raised.value)


def test_shares_are_disjoint_equal_and_inside_the_span() -> None:
    spans = []
    for worker in range(4):
        share = config.share_of((10_000, 32_767), worker, 4)
        assert share is not None, worker
        spans.append(range(share[0], share[1] + 1))
    assert all(span.start >= 10_000 and span.stop <= 32_768 for span in spans), spans
    assert sum(len(span) for span in spans) == len(set().union(*spans)), "no port in two shares"
    assert {len(span) for span in spans} == {22_768 // 4}
    assert config.share_of((10_000, 32_767), 4, 4) is None
    assert config.share_of((40_000, 40_399), 3, 4) == (40_300, 40_399)
    assert config.share_of((40_000, 40_398), 0, 4) is None, "a share under 100 ports is no share"


def test_the_pytest_plugin_gives_each_xdist_worker_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another worker could take the port of a node that is down for a restart, and the node could not come
    back; each worker (and what it starts) keeps to its own share of the default range or of the user's."""
    monkeypatch.delenv(config.PORTS_VARIABLE, raising=False)
    default = config.port_range()
    assert default is not None
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    pytest_plugin.pytest_configure()
    assert config.port_range() == config.share_of(default, 2, 4)
    monkeypatch.setenv(config.PORTS_VARIABLE, "40000-40399")
    pytest_plugin.pytest_configure()
    assert config.port_range() == (40200, 40299), "the user's range is shared out the same way"
    monkeypatch.setenv(config.PORTS_VARIABLE, "40000-40099")
    pytest_plugin.pytest_configure()
    assert config.port_range() == (40000, 40099), "a range too small to share is kept whole"
    monkeypatch.setenv(config.PORTS_VARIABLE, "40000-40399")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw5")  # xdist replaced two crashed workers
    pytest_plugin.pytest_configure()
    assert config.port_range() == (40100, 40199)
    monkeypatch.delenv(config.PORTS_VARIABLE)
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    pytest_plugin.pytest_configure()
    assert config.PORTS_VARIABLE not in os.environ, "outside xdist nothing is set"
