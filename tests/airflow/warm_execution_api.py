"""Preloaded by the forkserver of :mod:`tests.airflow.warm_cli`: the in-process execution API, built once.

``airflow dags test`` and ``tasks test`` run each task against an in-process copy of Airflow's execution
API (``supervisor.in_process_api_server()``, cached per process). Building that app and Cadwyn's versioned
routers on its first request took most of a warm command's CPU (docs/benchmarks.md, "The test suite's
time"). Importing this module in the forkserver builds the app and its routers there, so every command
forked from it starts with them; the app's event loop, thread and lifespan are still started by each
command on its first request (``InProcessExecutionAPI.transport``), as in a cold process. The app holds no
connection: its DAG bag reads the DB on request, in the command's process.

Only the forkserver imports this module. An Airflow without these internals leaves the commands to build
the app themselves, as they would in a cold process.
"""

from __future__ import annotations

import sys


def _build() -> None:
    try:
        from airflow.sdk.execution_time.supervisor import in_process_api_server  # noqa: PLC0415
    except ImportError:
        return
    app = in_process_api_server().app
    initialize = getattr(app, "_cadwyn_initialize", None)
    if callable(initialize) and not getattr(app, "_cadwyn_initialized", True):
        initialize()


try:
    _build()
except Exception as exc:  # an optimisation only: each command builds what it lacks
    print(f"warm_execution_api: not preloaded ({type(exc).__name__}: {exc})", file=sys.stderr)
