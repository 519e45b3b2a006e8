"""The Airflow plugin that registers the Liftbridge event listener when ``[liftbridge_events] enabled``.

Airflow loads it in every process (from the ``airflow.plugins`` entry point;
the provider info lists it too) and calls :meth:`LiftbridgeEventsPlugin.on_load`
there. Off (the default), it registers nothing and imports nothing more. Bad
options are refused there with a ValueError naming the option: Airflow logs it
and lists it among the plugins' import errors, and the process runs on
without the listener.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import AirflowPlugin, conf

from liftbridge_provider.events.settings import DEFAULTS, SECTION, EventSettings

_LISTENERS: list[Any] = []  # this process's listener once loaded (one per process, whichever plugin loader asks)


def load_settings() -> EventSettings:
    """The ``[liftbridge_events]`` options from Airflow's configuration, checked (ValueError if bad)."""
    return EventSettings.from_options(lambda name: conf.get(SECTION, name, fallback=DEFAULTS[name]))


class LiftbridgeEventsPlugin(AirflowPlugin):
    """Publishes Airflow's DAG-run and task-instance events to a Liftbridge stream (``[liftbridge_events]``)."""

    name = "liftbridge_events"
    listeners: list[Any] = _LISTENERS

    @classmethod
    def on_load(cls, *args: Any, **kwargs: Any) -> None:
        settings = load_settings()
        if not settings.enabled or _LISTENERS:
            return
        from liftbridge_provider.events.listener import LiftbridgeEventListener  # noqa: PLC0415 - only when on

        _LISTENERS.append(LiftbridgeEventListener(settings=settings))
