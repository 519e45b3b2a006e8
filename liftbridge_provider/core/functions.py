"""User functions named by a dotted path (``package.module.name``), as operators, sensors and triggers take them."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from liftbridge_provider.core.errors import InvalidArgumentError


def import_function(dotted_path: str, what: str = "apply_function") -> Callable[..., Any]:
    """The callable at ``dotted_path``; InvalidArgumentError naming it when it cannot be imported or called."""
    if not isinstance(dotted_path, str) or "." not in dotted_path:
        raise InvalidArgumentError(f"{what} must be a dotted path package.module.name, got {dotted_path!r}")
    module_name, _, name = dotted_path.rpartition(".")
    try:
        function = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"{what} {dotted_path!r} cannot be imported ({exc}); it must be a dotted path to a function in a "
            "module on the Python path of the process that runs it (the triggerer's for a deferred sensor)"
        ) from exc
    if not callable(function):
        raise InvalidArgumentError(f"{what} {dotted_path!r} is not callable")
    return function  # type: ignore[no-any-return]
