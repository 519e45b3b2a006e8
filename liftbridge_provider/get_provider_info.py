"""Provider metadata that Airflow reads through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from liftbridge_provider import __version__
from liftbridge_provider.core.connection_fields import form_fields
from liftbridge_provider.events.settings import provider_config

CONNECTION_FIELDS: dict[str, Any] = form_fields()  # the form of the connection (core/connection_fields.py)


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
                    "liftbridge_provider.operators.commit",
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
            {"name": "liftbridge_events", "plugin-class": "liftbridge_provider.events.plugin.LiftbridgeEventsPlugin"},
            {"name": "liftbridge_ui", "plugin-class": "liftbridge_provider.ui.plugin.LiftbridgeUiPlugin"},
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
