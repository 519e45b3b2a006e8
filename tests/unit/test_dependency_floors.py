"""The floors of grpcio and protobuf are the versions the generated code checks for, and one target tests them.

The generated code (liftbridge_provider/_proto) refuses, when imported, a
grpcio older than the grpcio-tools that wrote it and a protobuf older than the
protoc bundled with it. pyproject.toml's lower bounds must say exactly that:
lower, and installs pass pip but fail at import; higher, and users next to
other providers are downgraded for nothing (README, "Versions"). The build pins
the generator ([build-system] requires); the pyspark-4.0 compatibility target
installs the floors, the newest one is above them.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

import liftbridge_provider._proto

ROOT = Path(__file__).resolve().parents[2]
GENERATED = Path(liftbridge_provider._proto.__file__).parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
FLOORS_TARGET = ROOT / "constraints" / "pyspark-4.0.txt"
NEWEST = ROOT / "constraints" / "newest.txt"


def floors() -> dict[str, Version]:
    """The ``>=`` bound of grpcio and protobuf in pyproject.toml's dependencies."""
    found = {}
    for line in PYPROJECT["project"]["dependencies"]:
        requirement = Requirement(line)
        if requirement.name in ("grpcio", "protobuf"):
            (floor,) = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
            found[requirement.name] = floor
    return found


def generated_checks() -> dict[str, Version]:
    """The versions the generated modules check for when imported."""
    grpc_module = (GENERATED / "liftbridge_api_pb2_grpc.py").read_text()
    messages = (GENERATED / "liftbridge_api_pb2.py").read_text()
    grpc_version = re.search(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'$", grpc_module, re.M)
    protobuf = re.search(r"ValidateProtobufRuntimeVersion\(\s*[\w.]+,\s*(\d+),\s*(\d+),\s*(\d+),", messages)
    assert grpc_version is not None, "the gRPC module no longer checks grpcio's version: what sets the floor now?"
    assert protobuf is not None, "the messages no longer check protobuf's version: what sets the floor now?"
    return {"grpcio": Version(grpc_version.group(1)), "protobuf": Version(".".join(protobuf.groups()))}


def pinned(constraints: Path) -> dict[str, Version]:
    lines = constraints.read_text().splitlines()
    return {
        name: Version(version)
        for line in lines
        if "==" in line and (name := line.split("==")[0]) in ("grpcio", "protobuf")
        for version in [line.split("==")[1]]
    }


READS_NEED_PROTOBUF = Version("5.28.0")
"""The reads parse messages from a bytearray (client/subscription.py), which protobuf refuses before 5.28.0."""


def test_the_floors_are_the_versions_the_generated_code_and_the_reads_need() -> None:
    checks = generated_checks()
    assert floors() == {"grpcio": checks["grpcio"], "protobuf": max(checks["protobuf"], READS_NEED_PROTOBUF)}


def test_the_build_pins_the_grpcio_tools_of_the_grpcio_floor() -> None:
    (pin,) = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("grpcio-tools")]
    assert pin == f"grpcio-tools=={floors()['grpcio']}"


def test_the_floors_target_installs_the_floors_and_the_newest_is_above_them() -> None:
    assert pinned(FLOORS_TARGET) == floors()
    newest = pinned(NEWEST)
    assert set(newest) == {"grpcio", "protobuf"}
    assert all(newest[name] > floor for name, floor in floors().items()), newest
