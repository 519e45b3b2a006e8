"""The generated wire API is fresh, and proto/ matches the pinned server's API field for field."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from liftbridge_provider._proto import liftbridge_api_pb2 as api

ROOT = Path(__file__).resolve().parents[2]
OUR_PROTO = ROOT / "proto" / "liftbridge_api.proto"
GENERATED = ROOT / "liftbridge_provider" / "_proto"
RPCS = {
    "CreateStream", "DeleteStream", "PauseStream", "SetStreamReadonly", "Subscribe", "FetchMetadata",
    "FetchPartitionMetadata", "Publish", "PublishAsync", "PublishToSubject", "SetCursor", "FetchCursor",
    "JoinConsumerGroup", "LeaveConsumerGroup", "FetchConsumerGroupAssignments", "ReportConsumerGroupCoordinator",
}  # fmt: skip


def run_gen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_proto.py"), *args], capture_output=True, text=True, check=False
    )


def test_generated_code_is_fresh() -> None:
    result = run_gen("--check")
    assert result.returncode == 0, result.stderr


def test_check_reports_stale_and_missing_files(tmp_path: Path) -> None:
    out = tmp_path / "_proto"
    assert run_gen("--out", str(out)).returncode == 0
    assert run_gen("--check", "--out", str(out)).returncode == 0
    (out / "liftbridge_api_pb2.py").write_text("# edited by hand\n")
    (out / "liftbridge_api_pb2_grpc.py").unlink()
    result = run_gen("--check", "--out", str(out))
    assert result.returncode == 1
    assert "liftbridge_api_pb2.py" in result.stderr
    assert "liftbridge_api_pb2_grpc.py" in result.stderr


def test_service_has_every_rpc() -> None:
    service = api.DESCRIPTOR.services_by_name["API"]
    assert service.full_name == "proto.API"
    assert {m.name for m in service.methods} == RPCS
    assert service.methods_by_name["PublishAsync"].client_streaming
    assert service.methods_by_name["Subscribe"].server_streaming


def _shape(proto: Path) -> dict[str, object]:
    """Names, numbers, types and labels of every message, enum and RPC, without comments or options."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        assert protoc.main(["protoc", f"-I{proto.parent}", f"--descriptor_set_out={out}", str(proto)]) == 0
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    shape: dict[str, object] = {}

    def walk(prefix: str, messages: object) -> None:
        for m in messages:  # type: ignore[attr-defined]
            name = prefix + m.name
            shape[name] = sorted((f.name, f.number, f.type, f.label, f.type_name) for f in m.field)
            for enum in m.enum_type:
                shape[f"{name}.{enum.name}"] = sorted((v.name, v.number) for v in enum.value)
            walk(name + ".", m.nested_type)

    (file,) = files.file
    walk(file.package + ".", file.message_type)
    for enum in file.enum_type:
        shape[f"{file.package}.{enum.name}"] = sorted((v.name, v.number) for v in enum.value)
    for service in file.service:
        shape[f"{file.package}.{service.name}"] = sorted(
            (m.name, m.input_type, m.output_type, m.client_streaming, m.server_streaming) for m in service.method
        )
    return shape


def _server_api_proto() -> Path:
    """api.proto of the liftbridge-api module that the pinned server is built with (from the Go module cache)."""
    go = shutil.which("go")
    assert go, "Go is required (it builds the pinned server); see README"
    tools = ROOT / "tools" / "go"
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    listing = subprocess.run(
        [go, "list", "-m", "-json", "github.com/liftbridge-io/liftbridge-api"],
        cwd=tools, capture_output=True, text=True, check=True, env=env,
    )  # fmt: skip
    module = json.loads(listing.stdout)
    download = subprocess.run(
        [go, "mod", "download", "-json", f"{module['Path']}@{module['Version']}"],
        cwd=tools, capture_output=True, text=True, check=True, env=env,
    )  # fmt: skip
    return Path(json.loads(download.stdout)["Dir"]) / "api.proto"


def test_proto_matches_pinned_server_api() -> None:
    ours, theirs = _shape(OUR_PROTO), _shape(_server_api_proto())
    differences = {k: (ours.get(k), theirs.get(k)) for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)}
    assert differences == {}
    assert len(ours) > 50


@pytest.mark.parametrize("module", ["liftbridge_api_pb2.py", "liftbridge_api_pb2.pyi", "liftbridge_api_pb2_grpc.py"])
def test_generated_modules_exist(module: str) -> None:
    assert (GENERATED / module).is_file()
