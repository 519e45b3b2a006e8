"""Provider metadata that Airflow reads through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from liftbridge_provider import __version__


def get_provider_info() -> dict[str, Any]:
    """Return the provider description Airflow's ProvidersManager validates and loads."""
    return {
        "package-name": "airflow-provider-liftbridge",
        "name": "Liftbridge",
        "description": "Liftbridge (durable, replicated message streams on NATS) for Apache Airflow.",
        "versions": [__version__],
    }
