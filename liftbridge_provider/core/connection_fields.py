"""The ``liftbridge`` connection's fields, defined once: the form, the parsing and the docs are built from them.

Each extra of the connection is one :class:`ConnectionField`. Airflow's form
(``conn-fields`` in the provider info) comes from :func:`form_fields`, the
parsing in :mod:`liftbridge_provider.connection` takes its field sets from
:func:`names`, and the table in ``docs/airflow.md`` is :func:`docs_table`
(a unit test keeps the page equal to it; ``python -m
liftbridge_provider.core.connection_fields`` prints it). A field's ``default``
is the client's own default (``ClientConfig``; a unit test holds them equal),
shown in the form and the docs. Pure data: importing it loads neither Airflow nor the
client, so the provider info stays cheap to read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Group = Literal["tls", "number", "flag", "nats"]

_TEXT: dict[str, Any] = {"type": ["string", "null"]}
_MULTILINE: dict[str, Any] = {"type": ["string", "null"], "format": "multiline"}
_SECRET: dict[str, Any] = {"type": ["string", "null"], "format": "password"}
_SECONDS: dict[str, Any] = {"type": ["number", "null"], "minimum": 0}
_COUNT: dict[str, Any] = {"type": ["integer", "null"], "minimum": 1}


@dataclass(frozen=True)
class ConnectionField:
    """One extra of the connection: its form label and help, JSON schema, group and default.

    ``group`` says how :mod:`liftbridge_provider.connection` reads it: ``tls``
    (a TLSConfig part), ``number`` (a ClientConfig number, of type ``kind``),
    ``flag`` (true or false) or ``nats`` (a NatsConfig part). ``docs`` is the
    meaning column of the docs table (the form's ``description`` when empty).
    """

    name: str
    label: str
    description: str
    schema: dict[str, Any]
    group: Group
    default: float | int | bool | None = None
    kind: type = str
    docs: str = ""

    def help(self) -> str:
        """The form's help text: the description and the default, if any."""
        if self.default is None:
            return self.description
        return f"{self.description} (default {_shown(self.default)})."

    def meaning(self) -> str:
        """The docs table's meaning column."""
        text = self.docs or self.description
        return text if self.default is None else f"{text} (default {_shown(self.default)})"


def _shown(value: float | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


FIELDS: tuple[ConnectionField, ...] = (
    ConnectionField(
        "tls_ca_cert",
        "TLS CA certificate",
        "Path to, or PEM text of, the CA that signs the brokers' certificates. Empty: plaintext, "
        "unless other TLS fields are set (then the system trust store is used).",
        _MULTILINE,
        "tls",
        docs="CA certificate: a path or PEM text",
    ),
    ConnectionField(
        "tls_client_cert",
        "TLS client certificate",
        "Path to, or PEM text of, the client certificate for mutual TLS.",
        _MULTILINE,
        "tls",
        docs="client certificate for mutual TLS: a path or PEM text",
    ),
    ConnectionField(
        "tls_private_key",
        "TLS client private key",
        "Path to, or PEM text of, the client's private key for mutual TLS. Kept secret.",
        _SECRET,
        "tls",
        docs="client private key for mutual TLS (a secret field; masked, never logged)",
    ),
    ConnectionField(
        "tls_server_name",
        "TLS server name",
        "Name expected in the broker certificate when it differs from the host dialled.",
        _TEXT,
        "tls",
    ),
    ConnectionField(
        "request_timeout",
        "Request timeout (s)",
        "Seconds for one request including retries",
        _SECONDS,
        "number",
        10.0,
        float,
    ),
    ConnectionField(
        "max_conns_per_broker", "Max connections per broker", "gRPC channels kept per broker", _COUNT, "number", 2, int
    ),
    ConnectionField(
        "keep_alive_time",
        "Idle keep-alive (s)",
        "Seconds an unused connection stays open",
        _SECONDS,
        "number",
        30.0,
        float,
    ),
    ConnectionField(
        "resubscribe_wait",
        "Resubscribe wait (s)",
        "Seconds a subscription keeps trying after losing its broker",
        _SECONDS,
        "number",
        30.0,
        float,
    ),
    ConnectionField(
        "read_isr_replica",
        "Read from ISR replicas",
        "Subscribe to any in-sync replica instead of the partition leader",
        {"type": ["boolean", "null"], "default": False},
        "flag",
        False,
        bool,
    ),
    ConnectionField(
        "nats_servers",
        "NATS servers",
        "The cluster's NATS URLs (nats://host:4222, comma separated). Set: batches are published straight to "
        "the streams' NATS subjects, several times faster. Empty: over gRPC.",
        _TEXT,
        "nats",
        docs="the cluster's NATS URLs (`nats://host:4222`, comma separated); set, the publish operator and "
        "`publish_batch` publish straight to NATS (several times faster, see `docs/client.md`)",
    ),
    ConnectionField("nats_user", "NATS user", "NATS user name (with the NATS password).", _TEXT, "nats"),
    ConnectionField("nats_password", "NATS password", "NATS password. Kept secret.", _SECRET, "nats"),
    ConnectionField("nats_token", "NATS token", "NATS authentication token. Kept secret.", _SECRET, "nats"),
    ConnectionField(
        "nats_credentials",
        "NATS credentials file",
        "Path of a NATS .creds file (JWT and NKey seed).",
        _TEXT,
        "nats",
    ),
    ConnectionField(
        "nats_tls_ca_cert",
        "NATS TLS CA certificate",
        "Path to, or PEM text of, the CA that signs the NATS servers' certificates (TLS to NATS).",
        _MULTILINE,
        "nats",
    ),
)

BY_NAME: dict[str, ConnectionField] = {field.name: field for field in FIELDS}


def names(group: Group) -> tuple[str, ...]:
    """The names of one group's fields, in form order."""
    return tuple(field.name for field in FIELDS if field.group == group)


def form_fields() -> dict[str, Any]:
    """Airflow's ``conn-fields``: one form field per extra."""
    return {f.name: {"label": f.label, "description": f.help(), "schema": dict(f.schema)} for f in FIELDS}


def docs_table() -> str:
    """The connection's table in ``docs/airflow.md`` (Markdown), host and port first."""
    rows = [
        "| field | meaning |",
        "|---|---|",
        "| Brokers (host) | one or more `host:port`, comma separated: `broker1:9292,broker2:9292` |",
        "| Default port (port) | port for brokers given without one (default 9292) |",
    ]
    rows += [f"| `{field.name}` | {field.meaning()} |" for field in FIELDS]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(docs_table(), end="")
