"""Command line for development servers.

    python -m liftbridge_provider.devserver start [--nodes 3] [--data-dir DIR]
    python -m liftbridge_provider.devserver status
    python -m liftbridge_provider.devserver brokers
    python -m liftbridge_provider.devserver stop

``start`` leaves the servers running in the background and records them in a
state file (default ``.devserver/state.json``, or ``$LIFTBRIDGE_DEVSERVER_STATE``,
or ``--state-file``) that ``status``, ``brokers`` and ``stop`` read.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import grpc

from liftbridge_provider.devserver.cluster import start_cluster, start_single
from liftbridge_provider.devserver.errors import DevServerError
from liftbridge_provider.devserver.process import ServerProcess
from liftbridge_provider.devserver.readiness import NotReady, check_ready

DEFAULT_STATE = Path(".devserver") / "state.json"


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = _parser().parse_args(argv)
    state_file: Path = args.state_file
    try:
        if args.command == "start":
            return _start(args, state_file)
        state = _load_state(state_file)
        if args.command == "stop":
            return _stop(state, state_file)
        if state is None:
            print(f"no dev server recorded in {state_file}", file=sys.stderr)
            return 1
        if args.command == "brokers":
            print(",".join(state["brokers"]))
            return 0
        return _status(state)
    except DevServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m liftbridge_provider.devserver", description=__doc__)
    parser.add_argument(
        "--state-file",
        type=Path,
        default=Path(os.environ.get("LIFTBRIDGE_DEVSERVER_STATE", DEFAULT_STATE)),
        help="where running servers are recorded (default: %(default)s)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="start servers in the background and wait until ready")
    start.add_argument("--nodes", type=int, default=1, help="1: one node with embedded NATS; more: a cluster")
    start.add_argument("--data-dir", type=Path, help="folder for configs, data and logs (default: a temp folder)")
    start.add_argument("--cursor-partitions", type=int, default=1, help="partitions of __cursors (default 1)")
    start.add_argument("--log-level", default="info", choices=["debug", "info", "warn", "error"])
    start.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for readiness (default 90)")
    commands.add_parser("status", help="show whether the recorded servers run and are ready (exit 1 if not)")
    commands.add_parser("brokers", help="print the broker addresses, comma separated")
    commands.add_parser("stop", help="stop the recorded servers (SIGINT, then SIGKILL)")
    return parser


def _start(args: argparse.Namespace, state_file: Path) -> int:
    existing = _load_state(state_file)
    if existing is not None and any(p.running for p in _processes(existing)):
        raise DevServerError(
            f"a dev server recorded in {state_file} is still running ({','.join(existing['brokers'])}); "
            "stop it first or pass another --state-file"
        )
    if args.nodes < 1:
        raise DevServerError(f"--nodes must be >= 1, got {args.nodes}")
    common: dict[str, Any] = {
        "data_dir": args.data_dir,
        "cursor_partitions": args.cursor_partitions,
        "log_level": args.log_level,
        "timeout": args.timeout,
        "tie_to_parent": False,
    }
    server = start_single(**common) if args.nodes == 1 else start_cluster(size=args.nodes, **common)
    state = server.describe()
    state_file.parent.mkdir(parents=True, exist_ok=True)
    state_file.write_text(json.dumps(state, indent=2) + "\n")
    print(f"liftbridge ready: {','.join(server.brokers)} (state in {state_file}, data in {server.root})")
    return 0


def _status(state: dict[str, Any]) -> int:
    healthy = True
    for node in state["nodes"]:
        process = ServerProcess(node["argv"], Path(node["log"]), pid=node["pid"])
        running = process.running
        healthy &= running
        print(f"{node['server_id']} {node['address']} pid {node['pid']}: {'running' if running else 'NOT running'}")
    if healthy:
        try:
            check_ready(state["brokers"], state["cursor_partitions"])
            print("ready")
        except (NotReady, grpc.RpcError) as exc:
            print(f"not ready: {exc}")
            healthy = False
    return 0 if healthy else 1


def _stop(state: dict[str, Any] | None, state_file: Path) -> int:
    if state is None:
        print(f"nothing to stop: no state file {state_file}")
        return 0
    for process in _processes(state):
        process.stop()
    if state.get("owns_root"):
        shutil.rmtree(state["root"], ignore_errors=True)
    state_file.unlink(missing_ok=True)
    print(f"stopped {','.join(state['brokers'])}")
    return 0


def _processes(state: dict[str, Any]) -> list[ServerProcess]:
    entries = [*reversed(state["nodes"]), *([state["nats"]] if state.get("nats") else [])]
    return [ServerProcess(e["argv"], Path(e["log"]), pid=e["pid"]) for e in entries]


def _load_state(state_file: Path) -> dict[str, Any] | None:
    if not state_file.exists():
        return None
    try:
        state: dict[str, Any] = json.loads(state_file.read_text())
    except (OSError, ValueError) as exc:
        raise DevServerError(f"cannot read state file {state_file}: {exc}") from exc
    return state


if __name__ == "__main__":
    sys.exit(main())
