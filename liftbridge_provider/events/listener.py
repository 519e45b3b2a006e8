"""LiftbridgeEventListener: Airflow's listener hooks for DAG-run and task-instance state changes, published.

Airflow calls these hooks in the process where the change happens: DAG-run
changes in the scheduler (and in `airflow dags test`, and in the API server
when a person marks a run), task-instance changes in the task's own process
(and in the API server when a person marks a task). Each hook builds the event
(``payloads.py``), masks it with Airflow's secrets masker (the ``redact`` the
task log uses: no event shows a value the log hides), offers it to this
process's :class:`EventPublisher` and returns: nothing waits on Liftbridge, and
no error leaves a hook (Airflow would log it, but a listener of ours must not
add noise to a task's outcome). ``before_stopping`` (a task process ends, the
scheduler stops) and interpreter exit wait at most ``flush_timeout`` for what
is queued.

Where the connection is looked up. In a task process every lookup goes over
the task's one channel to its supervisor, which is not the listener's to share:
on Airflow 3.3 a plain request from an async task's event loop fails the task
(``DeadlockImminentError``) while another thread holds that channel, and on
3.1 two threads on it can swap each other's answers. So a task-instance hook
looks the connection up itself, on the thread Airflow calls it on (the task's,
before the task's code runs or after it ended), and the publishing thread only
uses the result; a failed lookup drops and counts the events as a failed
publish would, and is tried again at a later hook (at most once per
``retry_interval``). Where only DAG-run hooks run (the scheduler: no task
channel there) the publishing thread looks it up, so the scheduler never waits
for it. After ``os.fork`` the child looks it up again.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import pluggy
from airflow.providers.common.compat.sdk import redact

from liftbridge_provider import telemetry
from liftbridge_provider.events.payloads import dag_run_event, encode, event_key, masked, task_instance_event
from liftbridge_provider.events.publisher import EventPublisher, Sender
from liftbridge_provider.events.settings import EventSettings

if TYPE_CHECKING:
    from liftbridge_provider.client import ClientConfig

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
        self._lookup_lock = threading.Lock()
        self._forget_connection()
        method = weakref.WeakMethod(self._forget_connection)
        os.register_at_fork(after_in_child=lambda: (forget := method()) is not None and forget())

    def _forget_connection(self) -> None:
        """No connection looked up yet (at construction, and in a forked child: it reads its own)."""
        self._config: ClientConfig | None = None
        self._lookup_error: str | None = None  # why the last lookup failed
        self._looked_up_at: float | None = None  # monotonic time of the last failed lookup
        self._hooks_look_up = False  # a task-instance hook looks it up, never the publishing thread

    def _look_up_here(self) -> None:
        """Look the connection up on this thread (a task-instance hook's) unless it is known, or the last
        try failed less than ``retry_interval`` ago; a failure is kept for the publisher to report."""
        if self._config is None:
            with self._lookup_lock:
                last = self._looked_up_at
                if self._config is None and (last is None or time.monotonic() - last >= self.settings.retry_interval):
                    try:
                        self._config = self._look_up()
                    except Exception as exc:
                        self._looked_up_at = time.monotonic()
                        self._lookup_error = f"{type(exc).__name__}: {exc}"
        self._hooks_look_up = True  # set once tried: the publisher reports its outcome from now on

    def _look_up(self) -> ClientConfig:
        """The connection's client settings, every request bounded by ``publish_timeout``."""
        from liftbridge_provider.hooks.liftbridge import LiftbridgeHook  # noqa: PLC0415 - loaded when it publishes

        config = LiftbridgeHook(liftbridge_conn_id=self.settings.conn_id).client_config()
        return dataclasses.replace(config, request_timeout=self.settings.publish_timeout)

    def _connect(self) -> Sender:
        """A client of its own (not the hook's pool, which tasks share); runs on the publishing thread, which
        looks the connection up itself only where no task-instance hook does (see the module's docstring)."""
        from liftbridge_provider.client import LiftbridgeClient  # noqa: PLC0415 - loaded only when it publishes

        config = self._config
        if config is None and self._hooks_look_up:
            why = self._lookup_error or "not looked up yet"
            raise LookupError(f"connection {self.settings.conn_id!r}: {why}")
        return LiftbridgeClient(config if config is not None else self._look_up())

    def _offer(self, kind: str, build: Any, *args: Any, delay: float = 0.0, **kwargs: Any) -> None:
        if kind not in self.settings.events:
            return
        try:
            event = masked(build(kind, *args, **kwargs), redact)
            if kind.startswith("task_instance."):
                self._look_up_here()
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
