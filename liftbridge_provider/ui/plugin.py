"""The Airflow plugin that adds the "Liftbridge" page to Airflow's UI (docs/airflow.md, "The Liftbridge page").

Two parts, both read by the API server only:

* ``fastapi_apps``: the page and its JSON API (:mod:`liftbridge_provider.ui.app`)
  mounted at :data:`URL_PREFIX`. The app is built on its first request
  (:class:`LazyApp`), so the other processes that load plugins (scheduler,
  triggerer, task processes) import neither FastAPI's routes nor Airflow's API
  security for it;
* ``external_views``: a "Liftbridge" entry in the navigation that shows that
  page inside Airflow's UI (at ``/plugin/liftbridge``).
"""

from __future__ import annotations

import threading
from typing import Any

from airflow.providers.common.compat.sdk import AirflowPlugin

URL_PREFIX = "/liftbridge"
ASGI = Any  # an ASGI callable (scope, receive, send)


class LazyApp:
    """An ASGI app that builds the page's FastAPI app on its first call and hands every call to it."""

    def __init__(self) -> None:
        self._app: ASGI | None = None
        self._lock = threading.Lock()

    def _built(self) -> ASGI:
        with self._lock:
            if self._app is None:
                from liftbridge_provider.ui.app import create_app  # noqa: PLC0415 - on the first request only

                self._app = create_app()
            return self._app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        app = self._app or self._built()
        await app(scope, receive, send)


class LiftbridgeUiPlugin(AirflowPlugin):
    """The "Liftbridge" page: streams, cursors and their lag, watchers and their dead letters per connection."""

    name = "liftbridge_ui"
    fastapi_apps: list[Any] = [{"app": LazyApp(), "url_prefix": URL_PREFIX, "name": "Liftbridge"}]  # noqa: RUF012
    external_views: list[Any] = [  # noqa: RUF012
        {
            "name": "Liftbridge",
            "href": f"{URL_PREFIX}/",
            "icon": f"{URL_PREFIX}/static/icon.svg",
            "url_route": "liftbridge",
            "destination": "nav",
        }
    ]
