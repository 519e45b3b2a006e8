"""A StatsD sink for tests: what Airflow's metrics send, collected from a UDP socket on loopback."""

from __future__ import annotations

import socket


class StatsdListener:
    """A UDP socket on loopback that collects the StatsD lines Airflow sends."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.lines: list[str] = []

    @property
    def env(self) -> dict[str, str]:
        return {
            "AIRFLOW__METRICS__STATSD_ON": "True",
            "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(self.sock.getsockname()[1]),
            "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
        }

    def received(self, prefix: str) -> list[str]:
        """Values of the lines for the stat named ``prefix`` so far (e.g. ``['0|g']``)."""
        while True:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            self.lines.extend(data.decode(errors="replace").splitlines())
        return [line.split(":", 1)[1] for line in self.lines if line.split(":", 1)[0] == prefix]

    def close(self) -> None:
        self.sock.close()
