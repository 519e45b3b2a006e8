"""Start, stop, kill and restart real Liftbridge servers on 127.0.0.1.

Two layouts:

- :func:`start_single`: one node with embedded NATS.
- :func:`start_cluster`: ``size`` nodes (default 3) sharing one external
  ``nats-server``, with replica timeouts lowered so a dead partition leader
  is replaced in about a second. A node can be killed without taking NATS
  down with it.

Every node gets its own folder under the launcher's root (a fresh temporary
folder unless ``data_dir`` is given) holding its config, data and log. Ports
are picked free on 127.0.0.1; a clash found at startup ("address already in
use") makes the launcher pick new ones. Namespaces are random, so launchers
running side by side never share Raft or NATS subjects.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from liftbridge_provider import fault_points
from liftbridge_provider.devserver import binaries, config
from liftbridge_provider.devserver.errors import DevServerError
from liftbridge_provider.devserver.inspection import partition_leaders
from liftbridge_provider.devserver.process import ServerProcess
from liftbridge_provider.devserver.readiness import NotReady, check_ready
from liftbridge_provider.devserver.startup import Unformed, wait_formed, wait_ready_once_more_after_a_startup_panic

PORT_ATTEMPTS = 5
ADDRESS_IN_USE = "address already in use"
METADATA_LEADER_LINE = "Server became metadata leader"
STARTUP_TIMEOUT = 30.0  # seconds for one process to bind its ports (and, for the seed, lead)
LEADERS_POLL = 0.1  # seconds between two rounds of partition_leaders over the nodes


@dataclass
class Node:
    """One Liftbridge server of a dev cluster."""

    server_id: str
    port: int
    folder: Path
    process: ServerProcess
    nats_port: int | None = None  # embedded NATS only

    @property
    def address(self) -> str:
        """The gRPC address clients dial, ``127.0.0.1:<port>``."""
        return f"{config.LOOPBACK}:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.folder / "data"

    @property
    def config_path(self) -> Path:
        return self.folder / "liftbridge.yaml"

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    @property
    def running(self) -> bool:
        return self.process.running

    @property
    def frozen(self) -> bool:
        """Stopped with SIGSTOP by :meth:`DevServer.freeze` (still running, answering nothing)."""
        return self.process.frozen


@dataclass
class DevServer:
    """A running set of Liftbridge nodes (one, or a cluster) and its shared NATS.

    Use it as a context manager, or call :meth:`stop`. ``brokers`` lists the
    gRPC addresses to give a client.
    """

    root: Path
    namespace: str
    nodes: list[Node]
    cursor_partitions: int
    owns_root: bool
    nats: ServerProcess | None = None
    nats_port: int | None = None
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    credentials: grpc.ChannelCredentials | None = None

    @property
    def brokers(self) -> list[str]:
        return [node.address for node in self.nodes]

    @property
    def nats_servers(self) -> list[str]:
        """The NATS URLs the cluster uses: its shared nats-server, or each node's embedded NATS."""
        if self.nats_port is not None:
            return [f"nats://{config.LOOPBACK}:{self.nats_port}"]
        return [f"nats://{config.LOOPBACK}:{node.nats_port}" for node in self.nodes if node.nats_port is not None]

    def kill_nats(self) -> None:
        """SIGKILL the shared nats-server (a cluster's; single nodes embed theirs)."""
        self._shared_nats().kill()

    def restart_nats(self, timeout: float = 30.0) -> None:
        """Start the shared nats-server again on its port, after :meth:`kill_nats`; wait until it is ready."""
        process = self._shared_nats()
        mark = process.log_size()
        process.start()
        process.wait_for(lambda: process.log_contains("Server is ready", mark), timeout, "NATS readiness")

    def _shared_nats(self) -> ServerProcess:
        if self.nats is None:
            raise DevServerError("this dev server has no shared nats-server: a single node embeds its NATS")
        return self.nats

    def node(self, server_id: str) -> Node:
        """The node with this server id (``n1``, ``n2``, ...)."""
        for node in self.nodes:
            if node.server_id == server_id:
                return node
        known = ", ".join(n.server_id for n in self.nodes)
        raise DevServerError(f"no node {server_id!r} in this dev server; nodes are {known}")

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until every running node lists all brokers and a replicated probe stream can be created."""
        running = [n for n in self.nodes if n.running]
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            for node in self.nodes:
                if not node.running:
                    raise DevServerError(
                        f"node {node.server_id} exited (status {node.process.exit_code}); "
                        f"log {node.log_path}:\n{node.process.log_tail()}"
                    )
            try:
                check_ready([n.address for n in running], self.cursor_partitions, self.credentials)
                return
            except NotReady as exc:
                last = str(exc)
            except grpc.RpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
            time.sleep(0.2)
        tails = "\n".join(f"--- {n.server_id} ({n.log_path}):\n{n.process.log_tail(15)}" for n in self.nodes)
        raise DevServerError(f"Liftbridge not ready after {timeout:.0f}s: {last}\n{tails}")

    @property
    def frozen(self) -> list[str]:
        """Server ids of the nodes frozen by :meth:`freeze` and not thawed yet."""
        return [n.server_id for n in self.nodes if n.frozen]

    def kill(self, server_id: str) -> None:
        """SIGKILL one node (a crash: no graceful shutdown); a frozen node dies too."""
        self.node(server_id).process.kill()

    def freeze(self, server_id: str) -> None:
        """SIGSTOP one node: its sockets stay open but it answers nothing, like a host that vanished
        without a TCP reset. :meth:`thaw` (or :meth:`stop`) lets it run again."""
        self.node(server_id).process.freeze()

    def thaw(self, server_id: str) -> None:
        """SIGCONT a node frozen by :meth:`freeze` (a no-op if it is not frozen)."""
        self.node(server_id).process.thaw()

    def partition_leaders(self, stream: str, timeout: float = 5.0) -> dict[int, str | None]:
        """``{partition: leader server id}`` of ``stream`` (None: no leader), from the first running, unfrozen
        node that knows the stream, asked in turn (every 0.1 s) for up to ``timeout`` seconds.

        A node learns of a new stream a moment after the metadata leader applied its creation, and followers
        of a new leader a moment after the controller picks it. Raises DevServerError when no node knew the
        stream or answered within ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while True:
            answering = [n for n in self.nodes if n.running and not n.frozen]
            if not answering:
                raise DevServerError("no running, unfrozen node to ask")
            last: Exception | None = None
            for node in answering:
                try:
                    return partition_leaders(
                        node.address, stream, self.credentials, max(deadline - time.monotonic(), LEADERS_POLL)
                    )
                except (grpc.RpcError, DevServerError) as exc:
                    last = exc
            if time.monotonic() + LEADERS_POLL > deadline:
                if isinstance(last, DevServerError):
                    raise last
                raise DevServerError(f"no node answered FetchMetadata for {stream!r}: {last}")
            time.sleep(LEADERS_POLL)

    def stop_node(self, server_id: str, timeout: float = 15.0) -> None:
        """Stop one node gracefully (SIGINT)."""
        self.node(server_id).process.stop(timeout)

    def restart(self, server_id: str, timeout: float = 60.0) -> None:
        """Start a stopped or killed node again on its own data dir and port, and wait until it rejoined."""
        node = self.node(server_id)
        if node.running:
            raise DevServerError(f"node {server_id} is still running (pid {node.process.pid}); kill or stop it first")
        if self.frozen:
            raise DevServerError(f"nodes {self.frozen} are frozen; thaw them first (readiness asks every node)")
        node.process.start()
        self.wait_ready(timeout)

    def stop(self, timeout: float = 15.0) -> None:
        """Thaw frozen nodes, stop every node (SIGINT, then SIGKILL after ``timeout`` s), then NATS;
        remove a temporary root."""
        for node in self.nodes:
            node.process.thaw()  # a frozen peer would stall the others' graceful shutdown
        for node in reversed(self.nodes):
            node.process.stop(timeout)
        if self.nats is not None:
            self.nats.stop(timeout)
        if self.owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description: what the CLI saves in its state file and prints."""
        return {
            "root": str(self.root),
            "owns_root": self.owns_root,
            "namespace": self.namespace,
            "cursor_partitions": self.cursor_partitions,
            "brokers": self.brokers,
            "nodes": [
                {
                    "server_id": n.server_id,
                    "address": n.address,
                    "pid": n.process.pid,
                    "argv": n.process.argv,
                    "data_dir": str(n.data_dir),
                    "log": str(n.log_path),
                }
                for n in self.nodes
            ],
            "nats": None
            if self.nats is None
            else {"port": self.nats_port, "pid": self.nats.pid, "argv": self.nats.argv, "log": str(self.nats.log_path)},
        }

    def __enter__(self) -> DevServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_single(
    *,
    data_dir: Path | str | None = None,
    cursor_partitions: int = 1,
    extra_config: Mapping[str, Any] | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    log_level: str = "info",
    timeout: float = 60.0,
    tie_to_parent: bool = True,
    nats_conf: str = "",
) -> DevServer:
    """Start one Liftbridge node with embedded NATS and wait until it is ready.

    :param data_dir: folder for the node's config, data and log; default a new
        temporary folder, removed by :meth:`DevServer.stop`. A given folder is kept.
    :param cursor_partitions: partitions of the ``__cursors`` stream (default 1).
    :param extra_config: Liftbridge settings (flat dotted keys) that override
        the defaults, e.g. TLS paths; ``{"cursors.stream.partitions": 0}``
        starts a server with cursors disabled (the server's own default).
    :param credentials: gRPC channel credentials for the readiness check when
        ``extra_config`` turns TLS on.
    :param log_level: server log level (debug, info, warn, error).
    :param timeout: seconds to wait for readiness (default 60).
    :param tie_to_parent: kill the server if the starting thread dies (Linux).
    :param nats_conf: settings appended to the embedded NATS server's config file, e.g. an
        ``authorization`` block (then give Liftbridge its own ``nats.user``/``nats.password`` in
        ``extra_config``).
    """
    _check_count("cursor_partitions", cursor_partitions)
    server = _new_server(data_dir, _cursor_setting(cursor_partitions, extra_config), credentials)
    try:
        node = _start_node(
            server,
            "n1",
            seed=True,
            embedded_nats=True,
            extra=extra_config,
            log_level=log_level,
            tie_to_parent=tie_to_parent,
            nats_conf=nats_conf,
        )
        server.nodes.append(node)
        wait_ready_once_more_after_a_startup_panic(server, node, timeout)
    except BaseException:
        server.stop(timeout=5.0)
        raise
    return server


def start_cluster(
    *,
    size: int = 3,
    data_dir: Path | str | None = None,
    cursor_partitions: int = 1,
    extra_config: Mapping[str, Any] | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    log_level: str = "info",
    timeout: float = 90.0,
    tie_to_parent: bool = True,
) -> DevServer:
    """Start ``size`` Liftbridge nodes (default 3) on one shared NATS server and wait until all joined.

    The nodes bootstrap the Raft group together (``clustering.raft.bootstrap.peers``),
    so the first metadata leader already counts every node and creates
    ``__cursors`` with one replica per node; a seed that led alone would give
    it a single replica, and committed cursors would die with that node.
    Replica timeouts are lowered (see
    :data:`config.FAST_FAILOVER`) so partition failover takes about a second.
    Parameters as for :func:`start_single`; ``timeout`` defaults to 90 s. A cluster whose nodes do not all
    know each other after half of it is stopped and started once more, in ``data_dir/second-start``
    (devserver/startup.py).
    """
    _check_count("size", size)
    _check_count("cursor_partitions", cursor_partitions)
    extra = {**config.FAST_FAILOVER, **(extra_config or {})}
    peers = [f"n{index}" for index in range(1, size + 1)]
    deadline = time.monotonic() + timeout
    for attempt in (1, 2):
        folder = data_dir if data_dir is None or attempt == 1 else Path(data_dir) / "second-start"
        server = _new_server(folder, _cursor_setting(cursor_partitions, extra_config), credentials)
        try:
            _start_nats(server, tie_to_parent)
            for server_id in peers:
                node = _start_node(
                    server,
                    server_id,
                    seed=False,
                    peers=peers,
                    embedded_nats=False,
                    extra=extra,
                    log_level=log_level,
                    tie_to_parent=tie_to_parent,
                )
                server.nodes.append(node)
            fault_points.reached("devserver.cluster_started")
            wait_formed(server, deadline, last_attempt=attempt == 2)
            return server
        except Unformed:
            server.stop(timeout=5.0)
        except BaseException:
            server.stop(timeout=5.0)
            raise
    raise AssertionError("unreachable: the second start returns or raises")


def _check_count(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")


def _cursor_setting(cursor_partitions: int, extra_config: Mapping[str, Any] | None) -> int:
    """The ``__cursors`` partitions the nodes will have: ``extra_config`` may set 0 (cursors disabled)."""
    return int((extra_config or {}).get("cursors.stream.partitions", cursor_partitions))


def _new_server(
    data_dir: Path | str | None, cursor_partitions: int, credentials: grpc.ChannelCredentials | None
) -> DevServer:
    if data_dir is None:
        root, owns = Path(tempfile.mkdtemp(prefix="lbdev-")), True
    else:
        root, owns = Path(data_dir).resolve(), False
        root.mkdir(parents=True, exist_ok=True)
    namespace = f"lbdev-{secrets.token_hex(5)}"
    return DevServer(
        root=root,
        namespace=namespace,
        nodes=[],
        cursor_partitions=cursor_partitions,
        owns_root=owns,
        credentials=credentials,
    )


def _start_nats(server: DevServer, tie_to_parent: bool) -> None:
    binary = binaries.nats_server_binary()
    log_path = server.root / "nats" / "nats-server.log"
    for _attempt in range(PORT_ATTEMPTS):
        port = config.free_port()
        process = ServerProcess(
            [str(binary), "-a", config.LOOPBACK, "-p", str(port)], log_path, tie_to_parent=tie_to_parent
        )
        mark = process.log_size()

        def ready(process: ServerProcess = process, mark: int = mark) -> bool:
            return process.log_contains("Server is ready", mark)

        if _start_and_wait(process, ready, "NATS readiness"):
            server.nats, server.nats_port = process, port
            return
    raise DevServerError(f"nats-server: ports kept clashing after {PORT_ATTEMPTS} attempts; see {log_path}")


def _start_node(
    server: DevServer,
    server_id: str,
    *,
    seed: bool,
    peers: Sequence[str] = (),
    embedded_nats: bool,
    extra: Mapping[str, Any] | None,
    log_level: str,
    tie_to_parent: bool,
    nats_conf: str = "",
) -> Node:
    binary = binaries.liftbridge_binary()
    telemetry = binaries.has_telemetry(binaries.liftbridge_version(binary))
    folder = server.root / server_id
    folder.mkdir(parents=True, exist_ok=True)
    argv = [str(binary), "--config", str(folder / "liftbridge.yaml")]
    process = ServerProcess(argv, folder / "liftbridge.log", tie_to_parent=tie_to_parent)
    for _attempt in range(PORT_ATTEMPTS):
        port = config.free_port()
        nats_port = config.free_port() if embedded_nats else server.nats_port
        nats_conf_path = folder / "nats.conf" if embedded_nats else None
        if nats_conf_path is not None:
            nats_conf_path.write_text(config.render_nats_conf(nats_port or 0, nats_conf))
        settings = config.liftbridge_settings(
            server_id=server_id,
            namespace=server.namespace,
            port=port,
            data_dir=folder / "data",
            nats_url=f"nats://{config.LOOPBACK}:{nats_port}",
            seed=seed,
            peers=peers,
            cursor_partitions=server.cursor_partitions,
            telemetry_setting=telemetry,
            log_level=log_level,
            embedded_nats_config=nats_conf_path,
            extra=extra,
        )
        node = Node(server_id, port, folder, process, nats_port=nats_port if embedded_nats else None)
        node.config_path.write_text(config.render_yaml(settings))
        server.settings[server_id] = settings
        mark = process.log_size()

        def started(node: Node = node, mark: int = mark) -> bool:
            if seed and not node.process.log_contains(METADATA_LEADER_LINE, mark):
                return False
            return _port_open(node.port)

        if _start_and_wait(process, started, "metadata leadership" if seed else "its gRPC port"):
            return node
    raise DevServerError(
        f"liftbridge {server_id}: ports kept clashing after {PORT_ATTEMPTS} attempts; see {process.log_path}"
    )


def _start_and_wait(process: ServerProcess, condition: Callable[[], bool], what: str) -> bool:
    """Start ``process`` and wait for ``condition``; False if a taken port made it fail (the caller retries)."""
    mark = process.log_size()
    process.start()
    try:
        process.wait_for(condition, STARTUP_TIMEOUT, what)
    except DevServerError:
        process.kill()
        if process.log_contains(ADDRESS_IN_USE, mark):
            return False
        raise
    return True


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((config.LOOPBACK, port)) == 0
