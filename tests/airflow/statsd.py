"""A StatsD sink for tests: what Airflow's metrics send, collected from a UDP socket on loopback."""

from __future__ import annotations

import socket
import threading


class StatsdListener:
    """A UDP socket on loopback that collects the StatsD lines Airflow sends."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.lines: list[str] = []
        self._collector: threading.Thread | None = None
        self._stop = threading.Event()

    def collect_in_background(self) -> None:
        """Read the socket on a thread from now on, so that a busy Airflow (a scheduler sends many figures)
        never fills the socket's buffer, where the kernel would drop the lines that come after."""
        self._collector = threading.Thread(target=self._collect, daemon=True)
        self._collector.start()

    def _collect(self) -> None:
        while not self._stop.is_set():
            self._read()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except (TimeoutError, OSError):
                return
            self.lines.extend(data.decode(errors="replace").splitlines())

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
        if self._collector is None:
            self._read()
        return [line.split(":", 1)[1] for line in self.lines if line.split(":", 1)[0] == prefix]

    def close(self) -> None:
        self._stop.set()
        if self._collector is not None:
            self._collector.join(5)
        self.sock.close()
