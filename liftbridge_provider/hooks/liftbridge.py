"""LiftbridgeHook: a ``liftbridge`` Airflow connection turned into a pooled LiftbridgeClient."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseHook

from liftbridge_provider.client import (
    AsyncLiftbridgeClient,
    ClientConfig,
    InvalidArgumentError,
    LiftbridgeClient,
    LiftbridgeError,
    NoMetadataLeaderError,
    PermissionDeniedError,
    TLSConfig,
    UnavailableError,
)
from liftbridge_provider.client.options import DEFAULT_PORT, format_address, parse_broker

# Connection extras: field -> (ClientConfig field, type). Shown as form fields (see get_provider_info).
NUMBER_FIELDS: dict[str, type] = {
    "request_timeout": float,
    "max_conns_per_broker": int,
    "keep_alive_time": float,
    "resubscribe_wait": float,
}
TLS_FIELDS = ("tls_ca_cert", "tls_client_cert", "tls_private_key", "tls_server_name")
KNOWN_EXTRAS = {*NUMBER_FIELDS, *TLS_FIELDS, "read_isr_replica"}


def brokers_from(host: str | None, port: int | None) -> tuple[str, ...]:
    """Broker addresses from the connection's host (``a:9292,b:9292`` or ``a,b``) and default port."""
    if not host or not host.strip():
        raise InvalidArgumentError("the Liftbridge connection has no host: give one or more brokers as host:port")
    default_port = port or DEFAULT_PORT
    brokers = []
    for item in host.split(","):
        if item.strip():
            name, item_port = parse_broker(item if ":" in item.strip("[]") else f"{item.strip()}:{default_port}")
            brokers.append(format_address(name, item_port))
    return tuple(brokers)


def config_from_connection(host: str | None, port: int | None, extra: Mapping[str, Any]) -> ClientConfig:
    """The client configuration a connection describes; bad values raise InvalidArgumentError naming them."""
    unknown = sorted(set(extra) - KNOWN_EXTRAS)
    if unknown:
        raise InvalidArgumentError(f"unknown Liftbridge connection extras {unknown}; allowed: {sorted(KNOWN_EXTRAS)}")
    options: dict[str, Any] = {}
    for name, kind in NUMBER_FIELDS.items():
        value = extra.get(name)
        if value not in (None, ""):
            try:
                options[name] = kind(value)
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"connection extra {name} must be a number, got {value!r}") from None
    flag = extra.get("read_isr_replica")
    if flag not in (None, ""):
        if isinstance(flag, str) and flag.lower() in {"true", "false"}:
            flag = flag.lower() == "true"
        if not isinstance(flag, bool):
            raise InvalidArgumentError(f"connection extra read_isr_replica must be true or false, got {flag!r}")
        options["read_isr_replica"] = flag
    tls = {name: extra.get(name) or None for name in TLS_FIELDS}
    if any(tls.values()):
        options["tls"] = TLSConfig(
            ca=tls["tls_ca_cert"],
            cert=tls["tls_client_cert"],
            key=tls["tls_private_key"],
            server_name=tls["tls_server_name"],
        )
    return ClientConfig(brokers=brokers_from(host, port), **options)


class _ClientPool:
    """One LiftbridgeClient per (connection id, configuration) in this process, closed at exit."""

    def __init__(self) -> None:
        self._clients: dict[tuple[str, str], LiftbridgeClient] = {}
        self._lock = threading.Lock()
        atexit.register(self.close_all)

    def get(self, conn_id: str, config: ClientConfig) -> LiftbridgeClient:
        key = (conn_id, repr(config) + repr(config.tls and (config.tls.key, config.tls.cert, config.tls.ca)))
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = LiftbridgeClient(config)
            return client

    def close_all(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


CLIENTS = _ClientPool()


class LiftbridgeHook(BaseHook):
    """Talks to Liftbridge through the ``liftbridge`` connection ``liftbridge_conn_id``.

    The connection's host lists the brokers (``host:port``, comma separated;
    the port field is the default port, 9292). Extras, each its own form field:
    ``tls_ca_cert``, ``tls_client_cert``, ``tls_private_key`` (paths or PEM; the
    key is secret), ``tls_server_name``, ``request_timeout`` (s, default 10),
    ``max_conns_per_broker`` (default 2), ``keep_alive_time`` (s, default 30),
    ``resubscribe_wait`` (s, default 30), ``read_isr_replica`` (default false).

    :param liftbridge_conn_id: the connection id (default ``liftbridge_default``).
    """

    conn_name_attr = "liftbridge_conn_id"
    default_conn_name = "liftbridge_default"
    conn_type = "liftbridge"
    hook_name = "Liftbridge"

    def __init__(self, liftbridge_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.liftbridge_conn_id = liftbridge_conn_id

    def client_config(self) -> ClientConfig:
        """The client configuration of the connection (reads the connection)."""
        conn = self.get_connection(self.liftbridge_conn_id)
        return self._config(conn.host, conn.port, conn.extra_dejson)

    def get_conn(self) -> LiftbridgeClient:
        """The pooled client for this connection, shared by every task of this process."""
        return CLIENTS.get(self.liftbridge_conn_id, self.client_config())

    async def aget_async_client(self) -> AsyncLiftbridgeClient:
        """A new asyncio client for this connection (for triggers); the caller closes it."""
        conn = await self.aget_connection(self.liftbridge_conn_id)
        return AsyncLiftbridgeClient(self._config(conn.host, conn.port, conn.extra_dejson))

    def _config(self, host: str | None, port: int | None, extra: Mapping[str, Any]) -> ClientConfig:
        try:
            return config_from_connection(host, port, extra)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"connection {self.liftbridge_conn_id!r}: {exc.message}") from exc

    def test_connection(self) -> tuple[bool, str]:
        """Fetch the cluster metadata; answer (ok, a message a person can act on)."""
        try:
            config = self.client_config()
        except InvalidArgumentError as exc:
            return False, str(exc)
        try:
            with LiftbridgeClient(config) as client:
                metadata = client.fetch_metadata()
        except UnavailableError as exc:
            return False, _unavailable_message(config, exc)
        except NoMetadataLeaderError as exc:
            return False, f"Brokers answered but the cluster has no metadata leader yet (election running?): {exc}"
        except PermissionDeniedError as exc:
            return False, f"Connected, but the server's authorization policy denies this client: {exc}"
        except LiftbridgeError as exc:
            return False, f"Liftbridge error: {exc}"
        brokers = ", ".join(sorted(b.address for b in metadata.brokers.values()))
        return True, f"Connected: {len(metadata.brokers)} broker(s) ({brokers}), {len(metadata.streams)} stream(s)"


def _unavailable_message(config: ClientConfig, exc: UnavailableError) -> str:
    details = exc.message.lower()
    seeds = ", ".join(config.brokers)
    if any(word in details for word in ("handshake", "certificate", "tsi_", "hostname verification")):
        return f"TLS handshake with {seeds} failed (check the CA, client certificate and server name): {exc.message}"
    if "socket closed" in details and config.tls is None:
        return f"{seeds} closed the connection; does the server require TLS? ({exc.message})"
    return f"Cannot reach any broker at {seeds} (is Liftbridge running there?): {exc.message}"
