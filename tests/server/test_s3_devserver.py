"""The S3 launcher against the real gateway (Versity's versitygw): readiness, conditional writes, failures."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from liftbridge_provider.devserver import DevServerError, config
from liftbridge_provider.devserver.process import pid_runs
from liftbridge_provider.devserver.s3 import S3Server, start_s3
from liftbridge_provider.devserver.s3_requests import s3_request
from tests.server.test_devserver import listening_addresses
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def gateway() -> Iterator[S3Server]:
    with start_s3() as server:
        yield server


def test_it_answers_signed_requests_and_refuses_a_wrong_secret(gateway: S3Server) -> None:
    assert gateway.request("GET").status == 200
    wrong = s3_request(gateway.endpoint, "GET", access_key=gateway.settings.access_key, secret_key="not-the-secret")
    assert wrong.status == 403, wrong.body


def test_it_listens_on_loopback_only_and_keeps_its_keys_off_the_command_line(gateway: S3Server) -> None:
    pid = gateway.process.pid
    assert pid is not None
    assert listening_addresses(pid) == {"127.0.0.1"}
    command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert gateway.settings.secret_key.encode() not in command_line
    assert gateway.settings.access_key.encode() not in command_line


def test_conditional_puts_get_412_when_their_condition_fails(gateway: S3Server) -> None:
    bucket = gateway.create_bucket()
    first = gateway.request("PUT", bucket, "claims/0", body=b"first", headers={"If-None-Match": "*"})
    assert first.status == 200
    assert first.etag
    again = gateway.request("PUT", bucket, "claims/0", body=b"second", headers={"If-None-Match": "*"})
    assert again.status == 412, again.body
    replaced = gateway.request("PUT", bucket, "claims/0", body=b"third", headers={"If-Match": first.etag})
    assert replaced.status == 200
    assert replaced.etag != first.etag
    stale = gateway.request("PUT", bucket, "claims/0", body=b"fourth", headers={"If-Match": first.etag})
    assert stale.status == 412, stale.body
    assert gateway.request("GET", bucket, "claims/0").body == b"third"


def test_buckets_are_folders_of_its_data_folder_and_names_are_not_reused(gateway: S3Server) -> None:
    bucket = gateway.create_bucket()
    assert (gateway.data_dir / bucket).is_dir()
    with pytest.raises(DevServerError, match=r"CreateBucket .*HTTP 409"):
        gateway.create_bucket(bucket)


def test_stop_ends_it_and_removes_a_temporary_folder() -> None:
    server = start_s3()
    pid, root = server.process.pid, server.root
    assert pid is not None
    assert root.is_dir()
    server.stop()
    assert not pid_runs(pid, server.process.executable)
    assert not root.exists()


def test_ports_come_from_the_devserver_range(monkeypatch: pytest.MonkeyPatch) -> None:
    span = config.port_range() or (20_000, 29_999)  # under xdist: this worker's own share
    low, high = max(span[0], span[1] - 99), span[1]
    monkeypatch.setenv(config.PORTS_VARIABLE, f"{low}-{high}")
    with start_s3() as server:
        assert low <= server.port <= high
        assert server.request("GET").status == 200


def test_a_taken_port_makes_it_choose_another(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    taken_port = taken.getsockname()[1]
    real_free_port = config.free_port
    handed_out: list[int] = []

    def first_taken() -> int:
        handed_out.append(taken_port if not handed_out else real_free_port())
        return handed_out[-1]

    monkeypatch.setattr(config, "free_port", first_taken)
    try:
        with start_s3() as server:
            assert handed_out[0] == taken_port
            assert server.port != taken_port
            assert "address already in use" in server.log_path.read_text()
            assert server.request("GET").status == 200
    finally:
        taken.close()


def test_a_gateway_that_cannot_start_raises_quoting_its_log(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("a file where the buckets' folder should be")
    with pytest.raises(DevServerError) as raised:
        start_s3(data_dir=tmp_path, timeout=20)
    message = str(raised.value)
    assert "exited" in message
    assert "posix" in message
    assert "not a directory" in message
    assert (tmp_path / "versitygw.log").is_file()


def test_a_missing_binary_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VERSITYGW_BIN", str(tmp_path / "no-such-versitygw"))
    with pytest.raises(DevServerError, match=r"make tools.*tools/go-s3/go.mod"):
        start_s3(data_dir=tmp_path)


def test_it_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    script = (
        "import time\n"
        "from liftbridge_provider.devserver.s3 import start_s3\n"
        f"server = start_s3(data_dir={str(tmp_path)!r})\n"
        "print(server.process.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        executable = Path(os.readlink(f"/proc/{server_pid}/exe"))
        assert pid_runs(server_pid, executable)
    finally:
        parent.kill()
        parent.wait()
    wait_until(lambda: not pid_runs(server_pid, executable), 10, "the orphaned gateway to die")
