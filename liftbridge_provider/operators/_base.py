"""What every Liftbridge operator shares: the connection id, the pooled hook, error translation."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from liftbridge_provider.client import InvalidArgumentError, LiftbridgeClient, NoSuchPartitionError, NoSuchStreamError
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
