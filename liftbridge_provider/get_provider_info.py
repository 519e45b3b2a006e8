"""Provider metadata that Airflow reads through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from liftbridge_provider import __version__
from liftbridge_provider.events.settings import provider_config

_SECONDS = {"type": ["number", "null"], "minimum": 0}
_SECRET = {"type": ["string", "null"], "format": "password"}


def _field(label: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"label": label, "description": description, "schema": schema}


CONNECTION_FIELDS: dict[str, Any] = {
    "tls_ca_cert": _field(
        "TLS CA certificate",
        "Path to, or PEM text of, the CA that signs the brokers' certificates. Empty: plaintext, "
        "unless other TLS fields are set (then the system trust store is used).",
        {"type": ["string", "null"], "format": "multiline"},
    ),
    "tls_client_cert": _field(
        "TLS client certificate",
        "Path to, or PEM text of, the client certificate for mutual TLS.",
        {"type": ["string", "null"], "format": "multiline"},
    ),
    "tls_private_key": _field(
        "TLS client private key",
        "Path to, or PEM text of, the client's private key for mutual TLS. Kept secret.",
        {"type": ["string", "null"], "format": "password"},
    ),
    "tls_server_name": _field(
        "TLS server name",
        "Name expected in the broker certificate when it differs from the host dialled.",
        {"type": ["string", "null"]},
    ),
    "request_timeout": _field(
        "Request timeout (s)", "Seconds for one request including retries (default 10).", _SECONDS
    ),
    "max_conns_per_broker": _field(
        "Max connections per broker",
        "gRPC channels kept per broker (default 2).",
        {"type": ["integer", "null"], "minimum": 1},
    ),
    "keep_alive_time": _field("Idle keep-alive (s)", "Seconds an unused connection stays open (default 30).", _SECONDS),
    "resubscribe_wait": _field(
        "Resubscribe wait (s)", "Seconds a subscription keeps trying after losing its broker (default 30).", _SECONDS
    ),
    "read_isr_replica": _field(
        "Read from ISR replicas",
        "Subscribe to any in-sync replica instead of the partition leader.",
        {"type": ["boolean", "null"], "default": False},
    ),
    "nats_servers": _field(
        "NATS servers",
        "The cluster's NATS URLs (nats://host:4222, comma separated). Set: batches are published straight to "
        "the streams' NATS subjects, several times faster. Empty: over gRPC.",
        {"type": ["string", "null"]},
    ),
    "nats_user": _field("NATS user", "NATS user name (with the NATS password).", {"type": ["string", "null"]}),
    "nats_password": _field(
        "NATS password", "NATS password. Kept secret.", {"type": ["string", "null"], "format": "password"}
    ),
    "nats_token": _field(
        "NATS token", "NATS authentication token. Kept secret.", {"type": ["string", "null"], "format": "password"}
    ),
    "nats_credentials": _field(
        "NATS credentials file", "Path of a NATS .creds file (JWT and NKey seed).", {"type": ["string", "null"]}
    ),
    "nats_tls_ca_cert": _field(
        "NATS TLS CA certificate",
        "Path to, or PEM text of, the CA that signs the NATS servers' certificates (TLS to NATS).",
        {"type": ["string", "null"], "format": "multiline"},
    ),
}


def get_provider_info() -> dict[str, Any]:
    """Return the provider description Airflow's ProvidersManager validates and loads."""
    return {
        "package-name": "airflow-provider-liftbridge",
        "name": "Liftbridge",
        "description": "Liftbridge (durable, replicated message streams on NATS) for Apache Airflow, "
        "with PySpark ingestion of frozen offset ranges.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Liftbridge",
                "external-doc-url": "https://liftbridge.io/",
                "tags": ["service"],
            }
        ],
        "hooks": [
            {"integration-name": "Liftbridge", "python-modules": ["liftbridge_provider.hooks.liftbridge"]},
        ],
        "operators": [
            {
                "integration-name": "Liftbridge",
                "python-modules": [
                    "liftbridge_provider.operators.streams",
                    "liftbridge_provider.operators.publish",
                    "liftbridge_provider.operators.ranges",
                    "liftbridge_provider.operators.consume",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "Liftbridge",
                "python-modules": [
                    "liftbridge_provider.sensors.offset",
                    "liftbridge_provider.sensors.lag",
                    "liftbridge_provider.sensors.message",
                ],
            },
        ],
        "triggers": [
            {
                "integration-name": "Liftbridge",
                "python-modules": [
                    "liftbridge_provider.triggers.offset",
                    "liftbridge_provider.triggers.message",
                    "liftbridge_provider.triggers.await_message",
                ],
            },
        ],
        "queues": ["liftbridge_provider.queues.liftbridge.LiftbridgeMessageQueueProvider"],
        "plugins": [
            {"name": "liftbridge_events", "plugin-class": "liftbridge_provider.events.plugin.LiftbridgeEventsPlugin"}
        ],
        "config": provider_config(),
        "asset-uris": [
            {
                "schemes": ["liftbridge"],
                "handler": "liftbridge_provider.assets.liftbridge.sanitize_uri",
                "factory": "liftbridge_provider.assets.liftbridge.create_asset",
                "to_openlineage_converter": "liftbridge_provider.assets.liftbridge.convert_asset_to_openlineage",
            }
        ],
        "connection-types": [
            {
                "connection-type": "liftbridge",
                "hook-class-name": "liftbridge_provider.hooks.liftbridge.LiftbridgeHook",
                "hook-name": "Liftbridge",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login", "password"],
                    "relabeling": {"host": "Brokers", "port": "Default port"},
                    "placeholders": {
                        "host": "broker1:9292,broker2:9292",
                        "port": "9292",
                        "extra": "{}",
                    },
                },
                "conn-fields": CONNECTION_FIELDS,
            }
        ],
    }
