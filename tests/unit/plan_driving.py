"""Drive the sans-I/O call plans without a server: a scripted gRPC error and the loop the front ends run.

Shared by tests/unit/test_call_cores.py and test_watermarks.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from liftbridge_provider.client import LiftbridgeError, plans


class Rpc(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def drive(plan: plans.Plan[Any], answer: Callable[[plans.PlanAction], Any]) -> tuple[Any, list[plans.PlanAction]]:
    """Carry a plan out the way the front ends do, with ``answer`` standing in for I/O."""
    seen: list[plans.PlanAction] = []
    outcome: Any = None
    failure: BaseException | None = None
    while True:
        try:
            action = plan.throw(failure) if failure is not None else plan.send(outcome)
        except StopIteration as done:
            return done.value, seen
        seen.append(action)
        outcome, failure = None, None
        try:
            outcome = answer(action)
        except (grpc.RpcError, LiftbridgeError) as exc:
            failure = exc
