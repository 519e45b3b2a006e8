"""Generate liftbridge_provider/_proto from proto/*.proto with grpcio-tools.

Usage: python tools/gen_proto.py [--out DIR] [--check]

--out DIR  write the package somewhere else (default: liftbridge_provider/_proto)
--check    generate into a temporary folder and exit 1 if the checked-out
           package is missing or differs (it is stale)

The generated package holds, per .proto file, the messages (``*_pb2.py``),
their type stubs (``*_pb2.pyi``) and the gRPC stubs (``*_pb2_grpc.py``).
grpc_tools writes absolute imports between generated modules; they are
rewritten as relative imports so the modules live inside our package.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
DEFAULT_OUT = ROOT / "liftbridge_provider" / "_proto"
INIT_TEXT = '"""Generated from proto/ by tools/gen_proto.py. Do not edit."""\n'


def proto_files() -> list[Path]:
    files = sorted(PROTO_DIR.glob("*.proto"))
    if not files:
        raise SystemExit(f"no .proto files in {PROTO_DIR}")
    return files


def generate(out_dir: Path) -> None:
    """Write the generated modules for every proto file into ``out_dir``."""
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
