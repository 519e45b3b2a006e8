"""A ``liftbridge`` connection turned into a ClientConfig, without Airflow.

The Airflow hook and the Spark ingest job read the same connection: ``host``
lists the brokers (``a:9292,b:9292`` or ``a,b``), ``port`` is the default port
(9292), and the extras are the fields of
:mod:`~liftbridge_provider.core.connection_fields` (TLS, timeouts and pool sizes,
replica reads, and NATS for publishing straight to it).
:func:`config_from_connection_json` reads the JSON form of an Airflow
connection (``{"conn_type": "liftbridge", "host": ..., "port": ...,
"extra": {...}}``), as ``AIRFLOW_CONN_*`` variables and ``airflow connections
export --format json`` write it, so a job outside Airflow gets the whole
connection, not only its host.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from liftbridge_provider.client import ClientConfig, InvalidArgumentError, NatsConfig, TLSConfig
from liftbridge_provider.client.options import DEFAULT_PORT, format_address, parse_broker, split_nats_servers
from liftbridge_provider.core.connection_fields import BY_NAME, names

# Connection extras by how they are read (core/connection_fields.py defines them): ClientConfig numbers with
# their type, TLSConfig parts, NatsConfig parts (nats_servers turns NATS on; the others authenticate), flags.
NUMBER_FIELDS: dict[str, type] = {name: BY_NAME[name].kind for name in names("number")}
TLS_FIELDS = names("tls")
NATS_FIELDS = names("nats")
FLAG_FIELDS = names("flag")
KNOWN_EXTRAS = {*BY_NAME}
# Keys of an Airflow connection in JSON form; login, password, schema and description are not used.
CONNECTION_KEYS = {"conn_type", "host", "port", "extra", "login", "password", "schema", "description"}


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
    for name in FLAG_FIELDS:
        flag = extra.get(name)
        if flag not in (None, ""):
            if isinstance(flag, str) and flag.lower() in {"true", "false"}:
                flag = flag.lower() == "true"
            if not isinstance(flag, bool):
                raise InvalidArgumentError(f"connection extra {name} must be true or false, got {flag!r}")
            options[name] = flag
    tls = {name: extra.get(name) or None for name in TLS_FIELDS}
    if any(tls.values()):
        options["tls"] = TLSConfig(
            ca=tls["tls_ca_cert"],
            cert=tls["tls_client_cert"],
            key=tls["tls_private_key"],
            server_name=tls["tls_server_name"],
        )
    nats = nats_from_extras(extra)
    if nats is not None:
        options["nats"] = nats
    return ClientConfig(brokers=brokers_from(host, port), **options)


def nats_from_extras(extra: Mapping[str, Any]) -> NatsConfig | None:
    """The NATS settings of a connection, or None without ``nats_servers``; the others alone are refused."""
    given = {name: extra.get(name) for name in NATS_FIELDS if extra.get(name) not in (None, "")}
    if "nats_servers" not in given:
        if given:
            raise InvalidArgumentError(f"connection extras {sorted(given)} need nats_servers (the NATS URLs) too")
        return None
    ca = given.get("nats_tls_ca_cert")
    return NatsConfig(
        servers=split_nats_servers(given["nats_servers"]),
        user=given.get("nats_user"),
        password=given.get("nats_password"),
        token=given.get("nats_token"),
        credentials=given.get("nats_credentials"),
        tls=TLSConfig(ca=ca) if ca else None,
    )


def _json_object(text: str | bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidArgumentError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def config_from_connection_json(text: str | bytes) -> ClientConfig:
    """The client configuration of a connection in Airflow's JSON form.

    ``extra`` may be an object or a JSON string (Airflow writes both);
    ``conn_type``, when given, must be ``liftbridge``; ``port`` may be a number
    or a numeric string. Secrets are never echoed in errors.
    """
    connection = _json_object(text, "the Liftbridge connection JSON")
    unknown = sorted(set(connection) - CONNECTION_KEYS)
    if unknown:
        raise InvalidArgumentError(f"unknown keys {unknown} in the connection JSON; allowed: {sorted(CONNECTION_KEYS)}")
    conn_type = connection.get("conn_type")
    if conn_type not in (None, "liftbridge"):
        raise InvalidArgumentError(f"the connection's conn_type must be 'liftbridge', got {conn_type!r}")
    port = connection.get("port")
    if port in (None, ""):
        port = None
    elif isinstance(port, bool) or not str(port).isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgumentError(f"the connection's port must be a number 1-65535, got {port!r}")
    extra = connection.get("extra") or {}
    if isinstance(extra, str | bytes):
        extra = _json_object(extra, "the connection's extra")
    if not isinstance(extra, Mapping):
        raise InvalidArgumentError(f"the connection's extra must be a JSON object, got {type(extra).__name__}")
    return config_from_connection(connection.get("host"), int(port) if port is not None else None, extra)
