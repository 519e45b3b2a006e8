"""LiftbridgeEventListener: Airflow's listener hooks for DAG-run and task-instance state changes, published.

Airflow calls these hooks in the process where the change happens: DAG-run
changes in the scheduler (and in `airflow dags test`, and in the API server
when a person marks a run), task-instance changes in the task's own process
(and in the API server when a person marks a task). Each hook builds the event
(``payloads.py``), offers it to this process's :class:`EventPublisher` and
returns: nothing waits on Liftbridge, and no error leaves a hook (Airflow
would log it, but a listener of ours must not add noise to a task's outcome).
``before_stopping`` (a task process ends, the scheduler stops) and interpreter
exit wait at most ``flush_timeout`` for what is queued.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
from typing import Any

import pluggy

from liftbridge_provider import telemetry
from liftbridge_provider.events.payloads import dag_run_event, encode, event_key, task_instance_event
from liftbridge_provider.events.publisher import EventPublisher, Sender
from liftbridge_provider.events.settings import EventSettings

log = logging.getLogger(__name__)

hookimpl = pluggy.HookimplMarker("airflow")  # Airflow's listener hooks are pluggy hooks of project "airflow"


class LiftbridgeEventListener:
    """Publishes the state changes ``settings.events`` names to ``settings.stream`` (see ``settings.py``).

    :param settings: the checked ``[liftbridge_events]`` options.
    """

    def __init__(self, *, settings: EventSettings) -> None:
        self.settings = settings
        self.publisher = EventPublisher(
            connect=self._connect,
            stream=settings.stream,
            queue_size=settings.queue_size,
            publish_timeout=settings.publish_timeout,
            retry_interval=settings.retry_interval,
            on_drop=lambda reason, count: telemetry.count_by_reason(telemetry.EVENTS_DROPPED, count, reason=reason),
        )
        atexit.register(self.publisher.close, settings.flush_timeout)

    def _connect(self) -> Sender:
        """A client of its own (not the hook's pool, which tasks share) whose every request, the stream's
        metadata included, is bounded by ``publish_timeout``; runs on the publishing thread."""
        from liftbridge_provider.client import LiftbridgeClient  # noqa: PLC0415 - loaded only when it publishes
        from liftbridge_provider.hooks.liftbridge import LiftbridgeHook  # noqa: PLC0415 - likewise

        config = LiftbridgeHook(liftbridge_conn_id=self.settings.conn_id).client_config()
        return LiftbridgeClient(dataclasses.replace(config, request_timeout=self.settings.publish_timeout))

    def _offer(self, kind: str, build: Any, *args: Any, delay: float = 0.0, **kwargs: Any) -> None:
        if kind not in self.settings.events:
            return
        try:
            event = build(kind, *args, **kwargs)
            self.publisher.offer(event_key(event["dag_id"], event["run_id"]), encode(event), delay=delay)
        except Exception:
            log.exception("Liftbridge event listener: could not queue the %s event", kind)

    @hookimpl
    def on_dag_run_running(self, dag_run: Any, msg: str) -> None:
        self._offer("dag_run.running", dag_run_event, dag_run, msg=msg)

    @hookimpl
    def on_dag_run_success(self, dag_run: Any, msg: str) -> None:
        self._offer("dag_run.success", dag_run_event, dag_run, msg=msg, delay=self.settings.dag_run_end_delay)

    @hookimpl
    def on_dag_run_failed(self, dag_run: Any, msg: str) -> None:
        self._offer("dag_run.failed", dag_run_event, dag_run, msg=msg, delay=self.settings.dag_run_end_delay)

    @hookimpl
    def on_task_instance_running(self, previous_state: Any, task_instance: Any) -> None:
        self._offer("task_instance.running", task_instance_event, task_instance)

    @hookimpl
    def on_task_instance_success(self, previous_state: Any, task_instance: Any) -> None:
        self._offer("task_instance.success", task_instance_event, task_instance)

    @hookimpl
    def on_task_instance_failed(self, previous_state: Any, task_instance: Any, error: object) -> None:
        self._offer("task_instance.failed", task_instance_event, task_instance, error=error)

    @hookimpl
    def on_task_instance_skipped(self, previous_state: Any, task_instance: Any) -> None:
        self._offer("task_instance.skipped", task_instance_event, task_instance)

    @hookimpl
    def before_stopping(self, component: Any) -> None:
        """A task process is about to end (or the scheduler to stop): wait, at most ``flush_timeout``
        seconds, for the events it queued; what is left is dropped and counted."""
        try:
            self.publisher.drain(self.settings.flush_timeout)
        except Exception:
            log.exception("Liftbridge event listener: flushing events failed")
