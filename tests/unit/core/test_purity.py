"""liftbridge_provider/core stays pure: its modules import the standard library and each other, nothing else.

The imports are read from the source, not observed in ``sys.modules``: this
process has loaded grpc, Airflow and the rest for other tests already. Every
import statement counts, wherever it is (module level, inside a function,
under ``TYPE_CHECKING``), so none can hide there. ruff's TID251 (core's ruff.toml)
says the same while editing; this test also refuses any third-party package
and the rest of liftbridge_provider.
"""

from __future__ import annotations

import ast
import importlib
import sys
import tomllib
from pathlib import Path

import pytest

import liftbridge_provider.core

CORE = Path(liftbridge_provider.core.__file__).parent
PACKAGE = "liftbridge_provider.core"
RUFF_CONFIG = CORE / "ruff.toml"

NETWORK = ("socket", "ssl", "http", "urllib.request", "asyncio", "selectors")
"""Standard library modules that reach the network: not pure either."""

MODULES = {
    "checks",
    "connection_fields",
    "delta_plan",
    "errors",
    "functions",
    "iceberg_plan",
    "lake",
    "ranges",
    "spark_planning",
    "stream_options",
    "table_plan",
    "time_search",
    "watching",
}
"""The modules the shelf holds (at least): a test that found no file would prove nothing."""


def imported(source: str, package: str) -> list[tuple[int, str]]:
    """``(line, module)`` for every module an import statement of ``source`` names; a relative import is
    resolved against ``package``, and ``from liftbridge_provider import x`` names ``liftbridge_provider.x``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                named_package = base in ("liftbridge_provider", PACKAGE) or not node.module
                found.append((node.lineno, f"{base}.{alias.name}" if named_package else base))
    return found


def refused(module: str) -> bool:
    """Whether a core module may not import ``module``."""
    if module == PACKAGE or module.startswith(PACKAGE + "."):
        return False
    if any(module == banned or module.startswith(banned + ".") for banned in NETWORK):
        return True
    return module.split(".", maxsplit=1)[0] not in sys.stdlib_module_names


def faults(source: str, package: str = PACKAGE) -> list[str]:
    return [f"line {line}: {module}" for line, module in imported(source, package) if refused(module)]


def core_files() -> list[Path]:
    return sorted(CORE.rglob("*.py"))


def test_every_core_module_imports_only_the_standard_library_and_core() -> None:
    files = core_files()
    assert {path.stem for path in files} >= MODULES, "the shelf's modules are where this test looks"
    found = {str(path.relative_to(CORE)): faults(path.read_text()) for path in files}
    assert {name: lines for name, lines in found.items() if lines} == {}
    for path in files:
        name = ".".join(path.relative_to(CORE).with_suffix("").parts)
        importlib.import_module(PACKAGE if name == "__init__" else f"{PACKAGE}.{name}")


@pytest.mark.parametrize(
    "source",
    [
        "import grpc",
        "import grpc.aio",
        "from airflow.models import DAG",
        "import pyspark.sql",
        "from nats.aio.client import Client",
        "import deltalake",
        "from pyiceberg.catalog import load_catalog",
        "from google.protobuf import message",
        "import pyarrow as pa",
        "from liftbridge_provider._proto import liftbridge_api_pb2",
        "from liftbridge_provider.client.errors import error_from_rpc",
        "from liftbridge_provider import client",
        "from liftbridge_provider.spark import reader",
        "from ..client import errors",
        "from .. import telemetry",
        "import socket",
        "from urllib.request import urlopen",
        "def later():\n    import grpc",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from airflow.models import DAG",
        "try:\n    import uvloop\nexcept ImportError:\n    pass",
    ],
)
def test_the_check_refuses_what_core_may_not_import(source: str) -> None:
    assert faults(source), f"not refused: {source!r}"


def test_the_check_allows_the_standard_library_and_core() -> None:
    source = (
        "from __future__ import annotations\nimport json\nfrom urllib.parse import quote\n"
        "from collections.abc import Mapping\nfrom liftbridge_provider.core.errors import InvalidArgumentError\n"
        "from liftbridge_provider.core import checks\nfrom . import ranges\nfrom .lake import uncovered\n"
    )
    assert faults(source) == []


def test_ruff_bans_the_heavy_packages_in_core_only() -> None:
    """The editor-time half of the rule: TID251 bans them in core's own ruff configuration (ruff uses the closest
    one to each file), which extends the project's."""
    config = tomllib.loads(RUFF_CONFIG.read_text())
    assert config["extend"] == "../../pyproject.toml"
    banned = set(config["lint"]["flake8-tidy-imports"]["banned-api"])
    assert {"airflow", "pyspark", "grpc", "nats", "deltalake", "pyiceberg", "liftbridge_provider.client"} <= banned
    assert {"socket", "ssl", "http", "asyncio", "selectors", "urllib.request"} <= banned
