"""The launcher against the real Liftbridge server: single nodes, a three-node cluster, failures."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider._proto import liftbridge_api_pb2_grpc as api_grpc
from liftbridge_provider.devserver import DevServer, DevServerError, config, start_single
from liftbridge_provider.devserver.process import pid_runs
from liftbridge_provider.devserver.readiness import NotReady, check_ready
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def fetch_metadata(address: str, streams: list[str] | None = None) -> api.FetchMetadataResponse:
    with grpc.insecure_channel(address) as channel:
        response: api.FetchMetadataResponse = api_grpc.APIStub(channel).FetchMetadata(
            api.FetchMetadataRequest(streams=streams or []), timeout=10
        )
        return response


def create_stream(address: str, name: str, partitions: int, replication: int = 1) -> None:
    with grpc.insecure_channel(address) as channel:
        request = api.CreateStreamRequest(
            subject=f"subj.{name}", name=name, partitions=partitions, replicationFactor=replication
        )
        api_grpc.APIStub(channel).CreateStream(request, timeout=10)


def listening_addresses(pid: int) -> set[str]:
    """The local addresses of the TCP sockets ``pid`` listens on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:
            continue  # closed between listing and reading: not a listener
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A = LISTEN
                hex_ip = local.split(":")[0]
                if table == "tcp":
                    found.add(socket.inet_ntoa(bytes.fromhex(hex_ip)[::-1]))
                else:
                    found.add(hex_ip)
    return found


def test_single_node_lists_its_broker(liftbridge_server: DevServer) -> None:
    (address,) = liftbridge_server.brokers
    metadata = fetch_metadata(address)
    assert [(b.id, f"{b.host}:{b.port}") for b in metadata.brokers] == [("n1", address)]


def test_create_stream_then_metadata_shows_partitions_and_leaders(liftbridge_server: DevServer) -> None:
    address = liftbridge_server.brokers[0]
    create_stream(address, "devserver-three", partitions=3)
    metadata = fetch_metadata(address, ["devserver-three"])
    (stream,) = metadata.streamMetadata
    assert stream.error == api.StreamMetadata.OK
    assert stream.subject == "subj.devserver-three"
    assert sorted(stream.partitions) == [0, 1, 2]
    assert {p.leader for p in stream.partitions.values()} == {"n1"}
    assert all(list(p.isr) == ["n1"] for p in stream.partitions.values())


def test_cursor_and_activity_streams_are_enabled(liftbridge_server: DevServer) -> None:
    metadata = fetch_metadata(liftbridge_server.brokers[0], ["__cursors", "__activity"])
    assert {s.name: s.error for s in metadata.streamMetadata} == {
        "__cursors": api.StreamMetadata.OK,
        "__activity": api.StreamMetadata.OK,
    }
    with grpc.insecure_channel(liftbridge_server.brokers[0]) as channel:
        stub = api_grpc.APIStub(channel)
        create_stream(liftbridge_server.brokers[0], "devserver-cursor", partitions=1)
        stub.SetCursor(api.SetCursorRequest(stream="devserver-cursor", partition=0, cursorId="c", offset=7), timeout=10)
        fetched = stub.FetchCursor(api.FetchCursorRequest(stream="devserver-cursor", partition=0, cursorId="c"))
    assert fetched.offset == 7


def test_server_listens_on_loopback_only(liftbridge_server: DevServer) -> None:
    pid = liftbridge_server.nodes[0].process.pid
    assert pid is not None
    addresses = listening_addresses(pid)
    assert addresses, "the server listens on nothing?"
    assert addresses == {"127.0.0.1"}


def test_config_has_no_wildcard_address_and_no_telemetry_on(liftbridge_server: DevServer) -> None:
    text = liftbridge_server.nodes[0].config_path.read_text()
    assert "0.0.0.0" not in text
    assert "telemetry.enabled: true" not in text
    assert f'listen: "127.0.0.1:{liftbridge_server.nodes[0].port}"' in text


def test_two_single_nodes_side_by_side(liftbridge_server: DevServer) -> None:
    with start_single() as other:
        assert other.brokers != liftbridge_server.brokers
        assert other.root != liftbridge_server.root
        assert other.namespace != liftbridge_server.namespace
        create_stream(other.brokers[0], "only-on-other", partitions=1)
        assert fetch_metadata(other.brokers[0], ["only-on-other"]).streamMetadata[0].error == api.StreamMetadata.OK
        unknown = fetch_metadata(liftbridge_server.brokers[0], ["only-on-other"]).streamMetadata[0]
        assert unknown.error == api.StreamMetadata.UNKNOWN_STREAM
        other_root = other.root
    assert not other_root.exists(), "a temporary root is removed on stop"


def test_stop_is_graceful_and_leaves_nothing_running() -> None:
    server = start_single()
    process = server.nodes[0].process
    pid, log = process.pid, server.nodes[0].log_path
    assert pid is not None
    log_copy = log.read_text()
    server.stop()
    assert not pid_runs(pid, process.executable)
    assert process.exit_code is not None
    assert "Liftbridge" in log_copy


def test_port_in_use_makes_launcher_choose_another(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    taken_port = taken.getsockname()[1]
    real_free_port = config.free_port
    handed_out: list[int] = []

    def first_taken() -> int:
        port = taken_port if not handed_out else real_free_port()
        handed_out.append(port)
        return port

    monkeypatch.setattr(config, "free_port", first_taken)
    try:
        with start_single() as server:
            assert server.nodes[0].port != taken_port
            assert fetch_metadata(server.brokers[0]).brokers[0].port == server.nodes[0].port
            assert handed_out[0] == taken_port
            assert "address already in use" in server.nodes[0].log_path.read_text()
    finally:
        taken.close()


def test_server_exiting_during_startup_reports_log_tail(tmp_path: Path) -> None:
    with pytest.raises(DevServerError) as raised:
        start_single(data_dir=tmp_path, extra_config={"no.such.setting": 1}, timeout=20)
    message = str(raised.value)
    assert "exited" in message
    assert "no.such.setting" in message  # quoted from the server's own log
    assert not any(
        b"--config" in line and str(tmp_path).encode() in line
        for line in map(read_or_empty, Path("/proc").glob("[0-9]*/cmdline"))
    ), "a failed start left a server running"


def read_or_empty(path: Path) -> bytes:
    """The file's bytes, or none when it is gone: a process of another test may end while /proc is read."""
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from liftbridge_provider.devserver import start_single\n"
        f"server = start_single(data_dir={str(tmp_path)!r})\n"
        "print(server.nodes[0].process.pid, flush=True)\n"
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
    wait_until(lambda: not pid_runs(server_pid, executable), 10, "the orphaned server to die")


def test_missing_binary_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LIFTBRIDGE_BIN", str(tmp_path / "no-such-liftbridge"))
    with pytest.raises(DevServerError, match=r"make tools"):
        start_single(data_dir=tmp_path)


def test_bad_launcher_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match=r"cursor_partitions must be a whole number >= 1, got 0"):
        start_single(cursor_partitions=0)


def test_several_cursor_partitions() -> None:
    with start_single(cursor_partitions=3) as server:
        (cursors,) = fetch_metadata(server.brokers[0], ["__cursors"]).streamMetadata
        assert sorted(cursors.partitions) == [0, 1, 2]


@pytest.mark.cluster
def test_cluster_every_node_lists_three_brokers(liftbridge_cluster: DevServer) -> None:
    assert len(liftbridge_cluster.brokers) == 3
    for address in liftbridge_cluster.brokers:
        metadata = fetch_metadata(address)
        assert sorted(f"{b.host}:{b.port}" for b in metadata.brokers) == sorted(liftbridge_cluster.brokers)
    assert liftbridge_cluster.nats is not None
    assert liftbridge_cluster.nats_port is not None
    for process in [liftbridge_cluster.nats, *(n.process for n in liftbridge_cluster.nodes)]:
        assert process.pid is not None
        assert listening_addresses(process.pid) == {"127.0.0.1"}


@pytest.mark.cluster
def test_cluster_replicated_stream_has_leader_and_full_isr(liftbridge_cluster: DevServer) -> None:
    create_stream(liftbridge_cluster.brokers[0], "replicated", partitions=2, replication=3)

    def full_isr() -> bool:
        (stream,) = fetch_metadata(liftbridge_cluster.brokers[1], ["replicated"]).streamMetadata
        return len(stream.partitions) == 2 and all(len(p.isr) == 3 for p in stream.partitions.values())

    wait_until(full_isr, 15, "ISR of 3 on both partitions")


@pytest.mark.cluster
def test_killed_node_restarts_and_rejoins(liftbridge_cluster: DevServer) -> None:
    seed = liftbridge_cluster.brokers[0]
    create_stream(seed, "survivor", partitions=1, replication=3)
    victim = liftbridge_cluster.node("n3")
    old_pid = victim.process.pid
    liftbridge_cluster.kill("n3")
    assert not victim.process.running
    assert old_pid is not None
    assert not pid_runs(old_pid, victim.process.executable)

    def isr_without_n3() -> bool:
        (stream,) = fetch_metadata(seed, ["survivor"]).streamMetadata
        return "n3" not in stream.partitions[0].isr

    wait_until(isr_without_n3, 20, "n3 to leave the ISR")
    liftbridge_cluster.restart("n3")
    assert victim.running
    assert victim.process.pid != old_pid
    assert victim.data_dir.is_dir()

    def isr_with_n3() -> bool:
        (stream,) = fetch_metadata(seed, ["survivor"]).streamMetadata
        return "n3" in stream.partitions[0].isr

    wait_until(isr_with_n3, 30, "n3 to rejoin the ISR")
    assert any(b.id == "n3" for b in fetch_metadata(victim.address).brokers)


def run_cli(*args: str, state_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "liftbridge_provider.devserver", "--state-file", str(state_file), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_start_status_brokers_stop(tmp_path: Path) -> None:
    """The CLI starts a server that outlives it, refuses a second start on the same state file, reports it ready,
    prints its brokers, and `stop` ends every process it started and removes its data.

    After the stop, the test asks whether the recorded processes still run and whether a server that knows this
    server's stream answers at its address. It does not require that nothing answers there: the other test
    processes start servers on random ports all the time, and one may take the freed port at once."""
    state = tmp_path / "state.json"
    started = run_cli("start", state_file=state)
    assert started.returncode == 0, started.stderr
    try:
        again = run_cli("start", state_file=state)
        assert again.returncode == 1
        assert "still running" in again.stderr
        status = run_cli("status", state_file=state)
        assert status.returncode == 0, status.stdout + status.stderr
        assert "ready" in status.stdout
        brokers = run_cli("brokers", state_file=state).stdout.strip()
        assert fetch_metadata(brokers).brokers[0].id == "n1"
        create_stream(brokers, "cli-owned", partitions=1)
        assert knows_stream(brokers, "cli-owned")
        recorded = json.loads(state.read_text())
    finally:
        stopped = run_cli("stop", state_file=state)
    assert stopped.returncode == 0, stopped.stderr
    assert not state.exists()
    assert run_cli("status", state_file=state).returncode == 1
    processes = [*recorded["nodes"], *([recorded["nats"]] if recorded["nats"] else [])]
    still_running = [p["pid"] for p in processes if pid_runs(p["pid"], Path(p["argv"][0]))]
    assert not still_running, f"pids {still_running} outlived the CLI's stop"
    assert recorded["owns_root"], "the CLI without --data-dir makes its own data folder"
    assert not Path(recorded["root"]).exists(), "stop left the server's data behind"
    assert not knows_stream(brokers, "cli-owned"), f"the stopped server still answers at {brokers}"


def knows_stream(address: str, name: str) -> bool:
    """Whether a server answers at ``address`` and has stream ``name`` (False when nothing answers)."""
    try:
        (stream,) = fetch_metadata(address, [name]).streamMetadata
    except grpc.RpcError:
        return False
    return stream.error == api.StreamMetadata.Error.OK and bool(stream.partitions)


def test_readiness_asks_no_node_for_brokers_before_every_node_serves(liftbridge_cluster: DevServer) -> None:
    """A node that accepts connections but does not serve gRPC yet (here: a bare listening socket, as a node
    whose Raft setup is still running) makes the cluster not ready, named as such. Asking the others for their
    broker list first would make them cache a list without it for two minutes."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    try:
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(NotReady, match=f"{address} does not serve gRPC yet"):
            check_ready([*liftbridge_cluster.brokers, address], liftbridge_cluster.cursor_partitions)
    finally:
        silent.close()
    check_ready(liftbridge_cluster.brokers, liftbridge_cluster.cursor_partitions)
