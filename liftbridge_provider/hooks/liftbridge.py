"""LiftbridgeHook: a ``liftbridge`` Airflow connection turned into a pooled LiftbridgeClient."""

from __future__ import annotations

import atexit
import json
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from airflow.providers.common.compat.sdk import get_hook_lineage_collector
from airflow.sdk import BaseHook
from airflow.sdk.log import mask_secret

from liftbridge_provider.assets.liftbridge import stream_uri
from liftbridge_provider.assets.offsets import offsets_extra
from liftbridge_provider.client import (
    AsyncLiftbridgeClient,
    ClientConfig,
    InvalidArgumentError,
    LiftbridgeClient,
    LiftbridgeError,
    Metadata,
    NoMetadataLeaderError,
    PermissionDeniedError,
    UnavailableError,
)
from liftbridge_provider.client.publish.nats_publisher import probe_nats
from liftbridge_provider.client.requests import CURSORS_STREAM

# The pure connection -> ClientConfig mapping lives in liftbridge_provider.connection (no Airflow import);
# re-exported here for callers that import it from the hook.
from liftbridge_provider.connection import (
    KNOWN_EXTRAS,
    NUMBER_FIELDS,
    TLS_FIELDS,
    brokers_from,
    config_from_connection,
)
from liftbridge_provider.core.ranges import OffsetRange

__all__ = [
    "KNOWN_EXTRAS",
    "NUMBER_FIELDS",
    "TLS_FIELDS",
    "LiftbridgeHook",
    "brokers_from",
    "config_from_connection",
]


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
    the port field is the default port, 9292). Its extras, each its own form
    field, are those of :mod:`~liftbridge_provider.core.connection_fields` (TLS,
    timeouts and pool sizes, replica reads, NATS to publish batches straight to
    it); ``docs/airflow.md`` shows them in a table.

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

    def report_read(
        self, stream: str, *, ranges: Iterable[OffsetRange] | None = None, cursor_id: str | None = None
    ) -> None:
        """Hook lineage: this task read ``stream`` (an input asset ``liftbridge://<first broker>/<stream>``).

        With ``ranges`` (the half-open offsets ``[start, end)`` read per partition) and the cursor they
        started from, the asset carries them, and OpenLineage gets them as the ``liftbridge_offsets``
        dataset facet (``assets/offsets.py``). Report a stream once per task: the same stream with other
        offsets is another input asset.
        """
        extra = None if ranges is None else offsets_extra(stream, ranges, cursor_id)
        get_hook_lineage_collector().add_input_asset(context=self, uri=self.stream_uri(stream), asset_extra=extra)

    def report_written(self, stream: str) -> None:
        """Hook lineage: this task wrote to ``stream`` (an output asset)."""
        get_hook_lineage_collector().add_output_asset(context=self, uri=self.stream_uri(stream))

    def stream_uri(self, stream: str) -> str:
        """The asset URI of ``stream``: the connection's first broker names the cluster (OpenLineage namespace)."""
        return stream_uri(self.client_config().brokers[0], stream)

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
        found = f"Connected: {len(metadata.brokers)} broker(s) ({brokers}), {len(metadata.streams)} stream(s)"
        if config.nats is not None:
            try:
                max_payload = probe_nats(config.nats)
            except LiftbridgeError as exc:
                return False, f"{found}, but NATS (nats_servers) failed: {exc.message}"
            found += f"; NATS {', '.join(config.nats.servers)} (max_payload {max_payload} bytes)"
        return True, found + thin_cursors_warning(metadata)


CURSOR_REPLICAS_WANTED = 3  # replicas of each __cursors partition that survive the loss of one broker


def thin_cursors_warning(metadata: Metadata) -> str:
    """A warning ("" if none) when ``__cursors`` has fewer replicas than the cluster can give it.

    The server creates ``__cursors`` with "all brokers" counted when the first
    metadata leader is elected; a cluster bootstrapped from one seed node gets
    a single replica, and committed cursors go with that broker.
    """
    cursors = metadata.streams.get(CURSORS_STREAM)
    wanted = min(CURSOR_REPLICAS_WANTED, len(metadata.brokers))
    if cursors is None:
        return ""
    thin = sorted(p.id for p in cursors.partitions.values() if len(p.replicas) < wanted)
    if not thin:
        return ""
    least = min(len(cursors.partitions[pid].replicas) for pid in thin)
    return (
        f". Warning: {CURSORS_STREAM} partitions {thin} have {least} replica(s) on {len(metadata.brokers)} brokers;"
        " committed cursors are lost with one broker. Create the cluster with clustering.raft.bootstrap.peers"
        " (or set cursors.stream.replication.factor) before the first start"
    )


def _unavailable_message(config: ClientConfig, exc: UnavailableError) -> str:
    details = exc.message.lower()
    seeds = ", ".join(config.brokers)
    if any(word in details for word in ("handshake", "certificate", "tsi_", "hostname verification")):
        return f"TLS handshake with {seeds} failed (check the CA, client certificate and server name): {exc.message}"
    if "socket closed" in details and config.tls is None:
        return f"{seeds} closed the connection; does the server require TLS? ({exc.message})"
    return f"Cannot reach any broker at {seeds} (is Liftbridge running there?): {exc.message}"


def liftbridge_connection_json(conn_id: str = LiftbridgeHook.default_conn_name) -> str:
    """The whole connection as ``{"conn_type", "host", "port", "extra"}`` JSON: what ``spark_jobs/ingest.py``
    reads from ``LIFTBRIDGE_CONN_JSON`` (brokers, port, TLS, timeouts).

    Give it to a DAG as a macro (``user_defined_macros``) and to SparkSubmitOperator's
    ``env_vars``. It may hold a TLS private key, so the text is masked in logs and in
    the rendered template fields Airflow stores (``Connection.as_json`` escapes a PEM
    key's newlines, which defeats the masking).
    """
    conn = LiftbridgeHook.get_connection(conn_id)
    text = json.dumps({"conn_type": conn.conn_type, "host": conn.host, "port": conn.port, "extra": conn.extra_dejson})
    mask_secret(text)
    return text
