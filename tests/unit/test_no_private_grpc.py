"""No private grpc name in the package: no ``grpc._...`` module, no ``_channel``, ``_call``, ``_cython``, ``cygrpc``.

grpc's private parts change between releases without notice (cygrpc's
``segregated_call`` did; a change there failed every publish with a
``TypeError``). ruff's TID251 (pyproject.toml) bans grpc's private modules
while editing; it cannot ban attribute names, so this test parses every module
of the package and refuses, wherever they stand (module level, inside a
function, under ``TYPE_CHECKING``):

- an import of a module of grpc with a private part (``grpc._channel``,
  ``from grpc import _channel``, ``grpc.aio._call``...), also through
  ``importlib.import_module`` or ``__import__`` with a constant name;
- an attribute named ``_channel``, ``_call``, ``_cython`` or ``cygrpc``, read
  or written on anything, also through ``getattr``/``hasattr``/``setattr``
  with a constant name; except on ``self`` or ``cls`` where the module itself
  defines that name (an attribute it assigns on ``self``, a function, a class
  attribute): the project's own names, not grpc's.

``liftbridge_provider/_proto`` is left out: grpcio-tools writes it, and its
version check imports ``grpc._utilities`` (grpc's own code for grpc's own
version). No module is excepted: the last one, ``client/connections.py``,
reads whether a channel reaches its broker from its calls' own outcomes and a
connection check of its own now.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import grpc
import pytest

import liftbridge_provider

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(liftbridge_provider.__file__).parent
PACKAGES = [PACKAGE, ROOT / "pyspark_liftbridge"]
GENERATED = PACKAGE / "_proto"
PYPROJECT = ROOT / "pyproject.toml"

PRIVATE_ATTRIBUTES = frozenset({"_channel", "_call", "_cython", "cygrpc"})
"""Attribute names of grpc's internals the package may not touch: the cygrpc channel of a ``grpc.Channel``, the
call of a rendezvous or an aio call, the Cython core."""

_NAMED_BY_STRING = {"getattr", "hasattr", "setattr", "delattr"}
_IMPORTED_BY_STRING = {"import_module", "__import__"}


def private_grpc_module(module: str) -> bool:
    """Whether ``module`` is grpc's (``grpc`` or below it) and any part of its path is private (``_x``)."""
    parts = module.split(".")
    return parts[0] == "grpc" and any(part.startswith("_") for part in parts[1:])


def _own_names(tree: ast.AST) -> set[str]:
    """Names the module defines itself: functions, classes, class attributes, attributes assigned on self/cls."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(node.name)
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                targets = [stmt.target] if isinstance(stmt, ast.AnnAssign) else getattr(stmt, "targets", [])
                own.update(target.id for target in targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _on_self(node):
            own.add(node.attr)
    return own


def _on_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


def _constant_str(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def faults(source: str) -> list[str]:
    """``line N: what`` for every private grpc name ``source`` uses (empty when it uses none)."""
    tree = ast.parse(source)
    own = _own_names(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found.extend(f"line {line}: import {a.name}" for a in node.names if private_grpc_module(a.name))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [alias.name for alias in node.names]
            private = [n for n in names if private_grpc_module(f"{node.module}.{n}")]
            found.extend(f"line {line}: from {node.module} import {n}" for n in private)
        elif isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRIBUTES:
            if not (_on_self(node) and node.attr in own):
                found.append(f"line {line}: attribute {node.attr}")
        elif isinstance(node, ast.Call) and node.args:
            function = node.func
            called = function.id if isinstance(function, ast.Name) else getattr(function, "attr", None)
            if called in _NAMED_BY_STRING and len(node.args) >= 2:
                name = _constant_str(node.args[1])
                if name in PRIVATE_ATTRIBUTES:
                    found.append(f"line {line}: {called}(..., {name!r})")
            elif called in _IMPORTED_BY_STRING:
                name = _constant_str(node.args[0])
                if name is not None and private_grpc_module(name):
                    found.append(f"line {line}: {called}({name!r})")
    return found


def package_files() -> list[Path]:
    return sorted(p for package in PACKAGES for p in package.rglob("*.py") if GENERATED not in p.parents)


def test_no_module_of_the_package_uses_a_private_grpc_name() -> None:
    files = package_files()
    assert len(files) > 50, "the package is where this looks"
    assert any(p.name == "connections.py" for p in files), "the package is where this looks"
    found = {str(p.relative_to(ROOT)): faults(p.read_text()) for p in files}
    assert {name: lines for name, lines in found.items() if lines} == {}


@pytest.mark.parametrize(
    "source",
    [
        "import grpc._channel",
        "import grpc._cython.cygrpc as core",
        "from grpc import _channel",
        "from grpc import StatusCode, _common",
        "from grpc._cython import cygrpc",
        "from grpc._utilities import first_version_is_lower",
        "import grpc.aio._call",
        "from grpc.aio import _base_call",
        "from grpc.aio._channel import Channel",
        "from grpc.experimental import _anything_new",
        "def later():\n    import grpc._common",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from grpc._channel import Channel",
        "def ready(channel):\n    return channel._channel.check_connectivity_state(False)",
        "def cancel(rendezvous):\n    rendezvous._call.cancel()",
        "import grpc\ncore = grpc._cython",
        "import grpc\nkind = grpc._cython.cygrpc.Channel",
        "core = getattr(channel, '_channel', None)",
        "ok = hasattr(grpc, '_cython')",
        "import importlib\nchannel_module = importlib.import_module('grpc._channel')",
        "module = __import__('grpc.aio._call')",
        "class Mine:\n    def run(self):\n        return self._channel.close()",  # not its own: an inherited grpc one
        "class Mine:\n    def __init__(self):\n        self._call = None\n\n    def peek(self, other):\n"
        "        return other._call",  # its own name, on something else
    ],
)
def test_the_check_refuses_private_grpc_names(source: str) -> None:
    assert faults(source), f"not refused: {source!r}"


def test_the_check_allows_grpcs_public_api_and_the_packages_own_names() -> None:
    source = (
        "import grpc\nimport grpc.aio\nimport grpc.experimental\nimport grpc_tools.protoc\n"
        "from grpc import StatusCode\nprint(grpc.__version__)\n"
        "channel = grpc.insecure_channel('127.0.0.1:9292')\nchannel.subscribe(print, try_to_connect=True)\n"
        "class Held:\n    _channel = None\n\n    def __init__(self):\n        self._call = None\n\n"
        "    def stop(self):\n        self._call.cancel()\n        return self._channel\n\n"
        "class Caller:\n    def _call(self, function):\n        return function()\n\n"
        "    def run(self):\n        return self._call(print)\n"
    )
    assert faults(source) == []


def test_ruff_bans_every_private_module_of_the_installed_grpc() -> None:
    """The editor-time half: TID251 bans each private module the installed grpc has, in the whole package (no file
    switches it off), and liftbridge_provider/core's own bans include all of grpc."""
    lint = tomllib.loads(PYPROJECT.read_text())["tool"]["ruff"]["lint"]
    banned = set(lint["flake8-tidy-imports"]["banned-api"])
    installed = Path(grpc.__file__).parent
    private = {
        "grpc." + ".".join(path.relative_to(installed).with_suffix("").parts)
        for path in [*installed.glob("_*"), *installed.glob("[!_]*/_*")]  # grpc._cython covers what is below it
        if not path.name.startswith("__") and (path.suffix == ".py" or path.is_dir())
    }
    assert {"grpc._channel", "grpc._cython", "grpc.aio._call"} <= private, "the installed grpc is where this looks"
    assert private - banned == set(), "private modules of the installed grpc that ruff does not ban"
    assert "TID" in lint["select"]
    switched_off = {pattern for pattern, rules in lint["per-file-ignores"].items() if "TID251" in rules}
    assert switched_off == set(), "TID251 switched off for some files"
    core = tomllib.loads((PACKAGE / "core" / "ruff.toml").read_text())
    assert "grpc" in core["lint"]["flake8-tidy-imports"]["banned-api"]
