"""The Liftbridge page's FastAPI app: the page itself and its read-only JSON API, behind Airflow's auth.

Mounted by the plugin at ``/liftbridge`` in Airflow's API server. Every route,
the page's HTML and script included, depends on Airflow's
``requires_access_connection("GET")``: the caller's JWT (the UI's cookie, or a
bearer token) must belong to a user the auth manager lets read connections
(with a ``connection_id`` in the path, that connection), else 401 (no or a bad
token) or 403. Routes:

* ``GET /``: the page (``static/page.html``, its script and style beside it);
* ``GET /api/connections``: the ``liftbridge`` connections, secret-free;
* ``GET /api/connections/{connection_id}``: the overview (streams, cursors,
  watchers, bounds), or ``503`` with ``{"error": ...}`` when the cluster did
  not answer in time or failed; ``404`` for no such ``liftbridge`` connection;
* ``GET /api/connections/{connection_id}/streams`` (``/cursors``,
  ``/watchers``): one part of the overview, with the same errors;
* ``GET /api/runs``: the last ingest runs with what their lakes record
  (``runs_service.py``), or ``503`` with ``{"error": ...}``.

Answers are bounded as :mod:`liftbridge_provider.ui.bounds` says and carry
``Cache-Control: no-store``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse, JSONResponse

from liftbridge_provider.ui.runs_service import RunsService
from liftbridge_provider.ui.service import OverviewService

STATIC = Path(__file__).with_name("static")
_FILES = {"page.js": "text/javascript", "page.css": "text/css", "icon.svg": "image/svg+xml"}
_NO_STORE = {"Cache-Control": "no-store"}
PARTS = ("streams", "cursors", "watchers")


def create_app(service: OverviewService | None = None, runs: RunsService | None = None) -> FastAPI:
    """The app, with its routes behind Airflow's connection-read permission."""
    from airflow.api_fastapi.core_api.security import requires_access_connection  # noqa: PLC0415 - API server only

    pages = service or OverviewService()
    ingest_runs = runs or RunsService()
    app = FastAPI(
        title="Liftbridge",
        description="Read-only views of the Liftbridge clusters of the liftbridge connections",
        dependencies=[Depends(requires_access_connection(method="GET"))],
    )

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "page.html", media_type="text/html", headers=_NO_STORE)

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> Any:
        if name not in _FILES:
            return JSONResponse({"error": "not found"}, status_code=404)
        return FileResponse(STATIC / name, media_type=_FILES[name], headers=_NO_STORE)

    @app.get("/api/connections")
    def connections() -> JSONResponse:
        return JSONResponse({"connections": pages.connections()}, headers=_NO_STORE)

    @app.get("/api/runs")
    def runs_view() -> JSONResponse:
        body, error, age = ingest_runs.answer()
        if body is None:
            return JSONResponse({"error": error, "age_s": round(age, 1)}, status_code=503, headers=_NO_STORE)
        return JSONResponse({**body, "age_s": round(age, 1)}, headers=_NO_STORE)

    def answer(connection_id: str, part: str | None) -> JSONResponse:
        conn = pages.find(connection_id)
        if conn is None:
            return JSONResponse(
                {"conn_id": connection_id, "error": f"no liftbridge connection {connection_id!r}"},
                status_code=404,
                headers=_NO_STORE,
            )
        overview, error, age = pages.overview(conn)
        if overview is None:
            return JSONResponse(
                {"conn_id": connection_id, "error": error, "age_s": round(age, 1)}, status_code=503, headers=_NO_STORE
            )
        body = overview if part is None else {"connection": overview["connection"], part: overview[part]}
        return JSONResponse({**body, "age_s": round(age, 1)}, headers=_NO_STORE)

    @app.get("/api/connections/{connection_id}")
    def overview(connection_id: str) -> JSONResponse:
        return answer(connection_id, None)

    @app.get("/api/connections/{connection_id}/{part}")
    def one_part(connection_id: str, part: str) -> JSONResponse:
        if part not in PARTS:
            return JSONResponse({"error": f"no view {part!r}; views: {', '.join(PARTS)}"}, status_code=404)
        return answer(connection_id, part)

    return app
