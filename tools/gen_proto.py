"""Generate liftbridge_provider/_proto from proto/*.proto with the grpcio-tools version the build pins.

Usage: python tools/gen_proto.py [--out DIR] [--check]

--out DIR  write the package somewhere else (default: liftbridge_provider/_proto)
--check    generate into a temporary folder and exit 1 if the checked-out
           package is missing or differs (it is stale)

The generated package holds, per .proto file, the messages (``*_pb2.py``),
their type stubs (``*_pb2.pyi``) and the gRPC stubs (``*_pb2_grpc.py``).
grpc_tools writes absolute imports between generated modules; they are
rewritten as relative imports so the modules live inside our package.

Which grpcio-tools: the generated code refuses, when imported, a grpcio older
than the grpcio-tools that wrote it and a protobuf older than the protoc it
bundles, so the generator's version sets the package's dependency floors
(pyproject.toml). It is the one ``[build-system] requires`` pins (the oldest
that still writes those checks; docs/architecture.md, "The wire API"), never
whatever is installed. The package build has it (pip's isolated build
environment): generation runs in this process. Anywhere else (``make proto``,
the tests) this script runs itself again in an environment of its own,
``.tools/grpcio-tools-<version>``, made on first use: the pinned grpcio-tools
needs a protobuf older than the development environment's.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import filecmp
import importlib.metadata
import re
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
DEFAULT_OUT = ROOT / "liftbridge_provider" / "_proto"
INIT_TEXT = '"""Generated from proto/ by tools/gen_proto.py. Do not edit."""\n'


def pinned_tools(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The grpcio-tools version ``[build-system] requires`` pins (``grpcio-tools==X``)."""
    requires = tomllib.loads(pyproject.read_text())["build-system"]["requires"]
    for requirement in requires:
        if match := re.fullmatch(r"grpcio-tools==([0-9.]+)", requirement.replace(" ", "")):
            return match.group(1)
    raise SystemExit(f"{pyproject}: [build-system] requires pins no grpcio-tools==X: {requires}")


def tool_env(version: str) -> Path:
    """Where this script runs the pinned grpcio-tools when this interpreter has another one (or none)."""
    return ROOT / ".tools" / f"grpcio-tools-{version}"


def proto_files() -> list[Path]:
    files = sorted(PROTO_DIR.glob("*.proto"))
    if not files:
        raise SystemExit(f"no .proto files in {PROTO_DIR}")
    return files


def generate(out_dir: Path) -> None:
    """Write the generated modules for every proto file into ``out_dir``, with the pinned grpcio-tools."""
    version = pinned_tools()
    if _installed_tools() != version:
        if Path(sys.prefix).resolve() == tool_env(version).resolve():
            raise SystemExit(f"{sys.prefix} has grpcio-tools {_installed_tools()}, not {version}: remove it")
        _run_in_tool_env(version, out_dir)
        return
    from grpc_tools import protoc  # noqa: PLC0415  (only where the pinned version is installed)

    out_dir.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    for proto in proto_files():
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(proto),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed for {proto}")
    modules = [p.stem + "_pb2" for p in proto_files()]
    for path in out_dir.glob("*_pb2*.py*"):
        path.write_text(_relative_imports(path.read_text(), modules))
    (out_dir / "__init__.py").write_text(INIT_TEXT)


def _installed_tools() -> str | None:
    try:
        return importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:
        return None


def _run_in_tool_env(version: str, out_dir: Path) -> None:
    python = _ensure_tool_env(version)
    command = [str(python), str(Path(__file__).resolve()), "--out", str(out_dir)]
    if subprocess.run(command, check=False).returncode != 0:
        raise SystemExit(f"generating with grpcio-tools {version} ({python}) failed")


def _ensure_tool_env(version: str) -> Path:
    """The tool environment's Python, the environment made first if missing (one process at a time)."""
    env = tool_env(version)
    python = env / "bin" / "python"
    with _locked(env.parent / f".grpcio-tools-{version}.lock"):
        if not (env / ".complete").is_file():
            print(f"making {env} (grpcio-tools=={version}) for tools/gen_proto.py", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
            pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            subprocess.run([*pip, f"grpcio-tools=={version}"], check=True)
            (env / ".complete").touch()
    return python


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _relative_imports(text: str, modules: list[str]) -> str:
    for module in modules:
        text = re.sub(rf"^import {module} as ", f"from . import {module} as ", text, flags=re.M)
    return text


def stale_files(current: Path) -> list[str]:
    """Names of generated files that are missing from or differ in ``current``."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(fresh)
        names = sorted(p.name for p in fresh.iterdir() if p.is_file())
        return [
            name
            for name in names
            if not (current / name).is_file() or not filecmp.cmp(fresh / name, current / name, shallow=False)
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.out)
        if stale:
            print(f"stale or missing in {args.out}: {', '.join(stale)}; run `make proto`", file=sys.stderr)
            return 1
        return 0
    generate(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
