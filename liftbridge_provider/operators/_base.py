"""What every Liftbridge operator shares: the connection id, the pooled hook, error translation."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import cached_property
from typing import Any

from airflow.providers.common.compat.sdk import AirflowFailException
from airflow.sdk import BaseOperator

from liftbridge_provider.client import InvalidArgumentError, LiftbridgeClient, NoSuchPartitionError, NoSuchStreamError
from liftbridge_provider.cursor_state import CursorStateStore
from liftbridge_provider.hooks.liftbridge import LiftbridgeHook

# Errors no retry can fix: bad input, and a stream or partition that does not exist.
PERMANENT_ERRORS = (InvalidArgumentError, NoSuchStreamError, NoSuchPartitionError)


@contextlib.contextmanager
def failing_without_retries(task_id: str) -> Iterator[None]:
    """Turn bad input and missing streams or partitions into AirflowFailException (no retries)."""
    try:
        yield
    except PERMANENT_ERRORS as exc:
        raise AirflowFailException(f"{task_id}: {exc}") from exc


def run_state(context: Any, client: LiftbridgeClient, stream: str) -> Any:
    """Where a task keeps state across its retries and clears within one DAG run: Airflow's task state
    store (Airflow 3.3+), else the same faces (``get``, ``set``) on the stream's cursors (CursorStateStore)."""
    store = context.get("task_state_store")
    if store is not None:
        return store
    ti = context["ti"]
    return CursorStateStore(
        client, stream, dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id, map_index=getattr(ti, "map_index", -1)
    )


class LiftbridgeBaseOperator(BaseOperator):
    """Base of the Liftbridge operators.

    :param liftbridge_conn_id: the ``liftbridge`` connection (default ``liftbridge_default``).
    """

    template_fields: tuple[str, ...] = ("liftbridge_conn_id",)

    def __init__(self, *, liftbridge_conn_id: str = LiftbridgeHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.liftbridge_conn_id = liftbridge_conn_id

    @cached_property
    def hook(self) -> LiftbridgeHook:
        return LiftbridgeHook(liftbridge_conn_id=self.liftbridge_conn_id)

    @contextlib.contextmanager
    def client(self) -> Iterator[LiftbridgeClient]:
        """The pooled client; bad input and missing streams or partitions fail the task without retries."""
        with failing_without_retries(self.task_id):
            yield self.hook.get_conn()
