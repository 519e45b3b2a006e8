"""The cluster steps of docs/spark.md ("On a cluster"), run as written, in a fresh environment on loopback.

Usage: python tools/cluster_trial.py [--wheel WHEEL] [--python /usr/bin/python3.11] [--folder DIR] [--keep]

The documentation's steps are fenced ``bash`` blocks, each after a marker
``<!-- cluster-trial: NAME -->``; this script reads them from docs/spark.md,
so what it runs is what a user reads. A held-out trial of the earlier steps
found that the worker command failed where the worker's Python lacked pyspark
("Could not find valid SPARK_HOME"), that every web UI listened on 0.0.0.0,
that each application unpacked the archive inside the venv's site-packages,
and that the commands assumed a ``python`` with pyspark on the PATH (issue 50).

What it does, in a folder of its own (a temporary one unless ``--folder``):

1. The wheel: ``--wheel``, or built with ``pip wheel`` from a copy of the
   working tree (the tree's ``build/`` is left alone: other builds use it).
2. A Liftbridge development server with a stream ``orders`` of two partitions,
   1,000 messages each (the documentation's ranges block reads offsets 0-999).
3. Step 1's settings replaced by the trial's own values for the variables it
   exports (loopback, a free master port, a worker folder per worker, the
   server's broker, a lake in its folder, the wheel); the script fails when the
   documentation exports one it has no value for. Every other block runs as written, with ``bash -euo pipefail``, in
   an environment with only the system's PATH (``/usr/local/bin:/usr/bin:/bin``:
   its ``python3`` has no pyspark), ``HOME``, ``LANG`` and the machine's pip
   settings (``PIP_*``; ``PIP_CONSTRAINT`` is the project's
   ``constraints/newest.txt``, the versions the tests ran with). The master and
   the two workers get free web UI ports (``SPARK_MASTER_WEBUI_PORT``,
   ``SPARK_WORKER_WEBUI_PORT``), which Spark reads from the environment: two
   workers share one machine here, and so do other test runs.
4. Steps 2 and 3 (install, pack) on the submitting machine's folder; the master
   and two workers in the background, each in a folder and process group of its
   own; the ranges; the submit twice (the second run finds every offset held);
   the read.

It fails when a block exits non-zero, when a master, worker, executor or driver
process listens on anything but 127.0.0.1, when an application unpacked
anywhere but the workers' ``SPARK_WORKER_DIR``, when the lake does not hold
each offset once, or when a run prints a warning docs/spark.md ("What a run
prints") says is gone. It prints each step's time and the workers' disk use;
exit status 0 when every check passed.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq

from liftbridge_provider.client import LiftbridgeClient, PublishMessage
from liftbridge_provider.devserver import start_single
from liftbridge_provider.devserver.config import free_port

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "spark.md"
BLOCK = re.compile(r"<!-- cluster-trial: (\w+) -->\s*\n```bash\n(.*?)```", re.S)
STEPS = ("settings", "install", "pack", "master", "worker", "ranges", "submit", "read")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
PARTITIONS, MESSAGES = 2, 1000
WORKERS = 2
GONE = (  # what docs/spark.md, "What a run prints", says no run prints any more
    "replaced a statically registered data source",
    "PySpark does not yet fully support pandas",
    "COLUMN_ALREADY_EXISTS",
)


class TrialFailed(Exception):
    """A step failed or a check did not hold."""


def doc_blocks(text: str) -> dict[str, str]:
    """The marked ``bash`` blocks of the documentation, by name; every step must be there once."""
    found: dict[str, str] = {}
    for name, body in BLOCK.findall(text):
        if name in found:
            raise TrialFailed(f"docs/spark.md marks two blocks {name!r}")
        found[name] = body
    missing = [name for name in STEPS if name not in found]
    if missing:
        raise TrialFailed(f"docs/spark.md has no cluster-trial block for {missing}")
    return found


def exported(block: str) -> set[str]:
    """The names a settings block exports (``export A=1 B=2  # comment`` lines)."""
    names: set[str] = set()
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            names.update(word.split("=", 1)[0] for word in words[1:] if "=" in word)
    return names


def settings_script(values: Mapping[str, str]) -> str:
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in values.items())


def base_environment() -> dict[str, str]:
    """A fresh shell's environment: the system's PATH, the machine's pip settings, the tests' constraints."""
    env = {"PATH": SYSTEM_PATH, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    env.update({key: value for key, value in os.environ.items() if key.startswith("PIP_")})
    env["PIP_CONSTRAINT"] = str(ROOT / "constraints" / "newest.txt")
    return env


class Machine:
    """A folder standing for one machine of the cluster, with its settings and environment."""

    def __init__(self, name: str, folder: Path, settings: Mapping[str, str], env: Mapping[str, str]) -> None:
        self.name = name
        self.folder = folder
        self.settings = dict(settings)
        self.env = dict(env)
        folder.mkdir(parents=True, exist_ok=True)

    def command(self, block: str) -> list[str]:
        return ["bash", "-euo", "pipefail", "-c", settings_script(self.settings) + block]

    def run(self, step: str, block: str, timeout: float, groups: set[int] | None = None) -> tuple[float, str]:
        """Run ``block`` in this machine's folder, in a process group of its own (added to ``groups``); its
        output is kept in ``<step>.log``."""
        started = time.monotonic()
        process = self.start(step, block)
        if groups is not None:
            groups.add(process.pid)
        try:
            returncode = process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise TrialFailed(f"{self.name}: step {step!r} took more than {timeout:.0f} s") from None
        output = (self.folder / f"{step}.log").read_text(errors="replace")
        if returncode != 0:
            raise TrialFailed(f"{self.name}: step {step!r} exited {returncode}:\n{output[-4000:]}")
        return time.monotonic() - started, output

    def start(self, step: str, block: str) -> subprocess.Popen[bytes]:
        with (self.folder / f"{step}.log").open("wb") as out:
            return subprocess.Popen(
                self.command(block), cwd=self.folder, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip


def build_wheel(folder: Path) -> Path:
    """The package's wheel, built from a copy of the working tree's files (tracked and new, not ignored)."""
    source = folder / "source"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        path = ROOT / name
        if path.is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", str(source), "-w", str(folder / "wheel")],
        check=True, timeout=900,
    )  # fmt: skip
    return next((folder / "wheel").glob("airflow_provider_liftbridge-*.whl"))


def group_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def listening(groups: set[int]) -> set[str]:
    """``address:port`` of every TCP socket that processes of these process groups listen on."""
    inodes: set[str] = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and group_of(int(entry.name)) in groups:
            try:
                links = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
            except OSError:
                continue
            inodes.update(link[8:-1] for link in links if link.startswith("socket:["))
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                address, port = fields[1].split(":")
                found.add(f"{_address(address, width)}:{int(port, 16)}")
    return found


def _address(hex_address: str, width: int) -> str:
    """An address of /proc/net/tcp{,6} (32-bit words in the host's byte order) as text."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if width == 8:
        return str(ipaddress.IPv4Address(words))
    address = ipaddress.IPv6Address(words)
    return str(address.ipv4_mapped or address)


@contextmanager
def watching_listeners(groups: set[int], seen: set[str]) -> Iterator[None]:
    """Add what the process groups in ``groups`` (which may grow meanwhile) listen on to ``seen``, every half
    second while the block runs."""
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.update(listening(set(groups)))
            stop.wait(0.5)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        seen.update(listening(set(groups)))


def wait_for(log: Path, text: str, process: subprocess.Popen[bytes], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        if process.poll() is not None:
            raise TrialFailed(f"{log.parent.name} ended ({process.returncode}):\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise TrialFailed(f"no {text!r} in {log} after {timeout:.0f} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def check_output(step: str, output: str) -> None:
    for text in GONE:
        if text in output:
            line = next(line for line in output.splitlines() if text in line)
            raise TrialFailed(f"step {step!r} printed {text!r}: {line.strip()}")


def lake_offsets(lake: Path) -> Counter[tuple[int, int]]:
    """(partition, offset) of every row the published pieces hold."""
    counts: Counter[tuple[int, int]] = Counter()
    for file in (lake / "stream=orders").glob("partition=*/range=*/*.parquet"):
        table = pq.read_table(file, columns=["partition", "offset"])
        counts.update(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True))
    return counts


def disk_use(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file() and not path.is_symlink())


def publish_orders(brokers: list[str]) -> None:
    """The stream the documentation's ranges block names: ``orders``, offsets 0-999 on each partition."""
    with LiftbridgeClient(brokers) as client:
        client.create_stream("orders", "orders", partitions=PARTITIONS)
        batch = [PublishMessage(f"{p}-{n}".encode(), partition=p) for n in range(MESSAGES) for p in range(PARTITIONS)]
        client.publish_batch("orders", batch, ack_policy="all")


def trial_settings(folder: Path, wheel: Path, python: str, brokers: list[str]) -> dict[str, str]:
    """The trial's values for step 1's settings (the submitting machine's; each worker gets its own folder)."""
    version = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    venv = folder / "venv"
    return {
        "PYTHON": python,
        "LB_VENV": str(venv),
        "LB_PACKAGE": str(wheel),
        "SPARK_HOME": f"{venv}/lib/python{version}/site-packages/pyspark",
        "MASTER_HOST": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_WORKER_DIR": str(folder / "submit" / "work"),
        "LIFTBRIDGE_CONN_JSON": json.dumps({"conn_type": "liftbridge", "host": ",".join(brokers)}),
        "LAKE": str(folder / "lake"),
    }


class Cluster:
    """The machines of the trial (one submitting machine, the master, the workers), each a folder here."""

    def __init__(self, folder: Path, settings: Mapping[str, str], blocks: Mapping[str, str]) -> None:
        env = base_environment()
        worker_dir = "SPARK_WORKER_DIR" in settings
        self.blocks = blocks
        self.submit = Machine("submit", folder / "submit", settings, env)
        self.master = Machine(
            "master", folder / "master", settings, {**env, "SPARK_MASTER_WEBUI_PORT": str(free_port())}
        )
        self.workers = [
            Machine(
                f"worker-{n}",
                folder / f"worker-{n}",
                {**settings, **({"SPARK_WORKER_DIR": str(folder / f"worker-{n}" / "work")} if worker_dir else {})},
                {**env, "SPARK_WORKER_WEBUI_PORT": str(free_port())},
            )
            for n in range(WORKERS)
        ]
        self.groups: set[int] = set()  # the process groups whose listening sockets are checked
        self.listeners: set[str] = set()

    def run(self, report: list[str]) -> None:
        """Every step after the settings, in the documentation's order; the servers stopped after."""
        blocks, submit = self.blocks, self.submit
        for step in ("install", "pack"):
            seconds, _ = submit.run(step, blocks[step], 1800)
            report.append(f"step {step}: {seconds:.0f} s")
        report.append(f"archive: {(submit.folder / 'liftbridge-spark-env.tar.gz').stat().st_size / 1e6:.0f} MB")
        servers: list[subprocess.Popen[bytes]] = []
        try:
            begun = time.monotonic()
            servers.append(self.master.start("master", blocks["master"]))
            wait_for(self.master.folder / "master.log", "I have been elected leader", servers[-1])
            for worker in self.workers:
                servers.append(worker.start("worker", blocks["worker"]))
                wait_for(worker.folder / "worker.log", "Successfully registered with master", servers[-1])
            report.append(f"steps master, worker x{WORKERS}: up in {time.monotonic() - begun:.0f} s")
            self.groups.update(server.pid for server in servers)
            submit.run("ranges", blocks["ranges"], 60)
            for attempt in ("submit", "submit-again"):  # the second finds every offset held
                with watching_listeners(self.groups, self.listeners):
                    seconds, output = submit.run(attempt, blocks["submit"], 900, self.groups)
                check_output(attempt, output)
                report.append(f"step {attempt}: {seconds:.0f} s")
        finally:
            for server in reversed(servers):  # the workers, then the master
                if server.poll() is None:
                    os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=60)
        seconds, output = submit.run("read", blocks["read"], 600)
        check_output("read", output)
        counts = ", ".join(f"Row(partition={p}, count={MESSAGES})" for p in range(PARTITIONS))
        if f"[{counts}]" not in output:
            raise TrialFailed(f"step read did not print [{counts}]:\n{output[-3000:]}")
        report.append(f"step read: {seconds:.0f} s")


def check_results(folder: Path, settings: Mapping[str, str], cluster: Cluster) -> list[str]:
    """Loopback only, each offset once, the archive unpacked in the workers' folders only; the report's lines
    (TrialFailed naming every check that did not hold). ``settings``: the trial's values, also those the
    documentation does not export."""
    problems = []
    wide = sorted(address for address in cluster.listeners if not address.startswith("127.0.0.1:"))
    if wide:
        problems.append(f"the cluster's processes listened beyond loopback: {wide}")
    report = [f"listening sockets seen: {len(cluster.listeners)}, {len(wide)} of them beyond 127.0.0.1"]
    counts = lake_offsets(folder / "lake")
    wanted = {(p, o) for p in range(PARTITIONS) for o in range(MESSAGES)}
    if set(counts) != wanted or max(counts.values()) != 1:
        most = max(counts.values(), default=0)
        problems.append(f"the lake holds {len(counts)} offsets (want {len(wanted)}), one of them {most} times")
    report.append(f"lake: {len(counts)} offsets, each at most {max(counts.values(), default=0)} time(s)")
    inside = Path(settings["SPARK_HOME"]) / "work"
    if inside.exists():
        problems.append(f"applications unpacked into {inside} (inside the venv): {disk_use(inside) / 1e6:.0f} MB")
    for worker in cluster.workers:
        work = Path(worker.settings.get("SPARK_WORKER_DIR", worker.folder / "work"))
        apps = len(list(work.glob("app-*")))
        report.append(
            f"{worker.name}: {apps} application folder(s) in its SPARK_WORKER_DIR, {disk_use(work) / 1e6:.0f} MB"
        )
    if problems:
        raise TrialFailed("; ".join(problems) + "\n" + "\n".join(report))
    return report


def trial(folder: Path, wheel: Path | None, python: str, doc: Path = DOC) -> list[str]:
    """Run the documented steps; return the report's lines (TrialFailed when a step or check fails)."""
    blocks = doc_blocks(doc.read_text())
    started = time.monotonic()
    report = []
    if wheel is None:
        wheel = build_wheel(folder)
        report.append(f"wheel built from the working tree: {wheel.name} ({time.monotonic() - started:.0f} s)")
    with start_single() as server:
        publish_orders(server.brokers)
        values = trial_settings(folder, wheel, python, server.brokers)
        documented = exported(blocks["settings"])
        if documented - set(values):
            raise TrialFailed(f"step 1 exports {sorted(documented - set(values))}: the trial has no value for it")
        cluster = Cluster(folder, {name: values[name] for name in sorted(documented)}, blocks)
        cluster.run(report)
    report.extend(check_results(folder, values, cluster))
    report.append(f"total: {time.monotonic() - started:.0f} s")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheel", type=Path, help="the package's wheel (default: built from the working tree)")
    parser.add_argument("--python", default="/usr/bin/python3.11", help="PYTHON of step 1 (default: %(default)s)")
    parser.add_argument("--folder", type=Path, help="where the trial works (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the folder (always kept when a step failed)")
    parser.add_argument("--doc", type=Path, default=DOC, help="the file whose blocks run (default: %(default)s)")
    args = parser.parse_args(argv)
    folder = args.folder or Path(tempfile.mkdtemp(prefix="cluster-trial-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"cluster trial in {folder}", flush=True)
    try:
        report = trial(folder, args.wheel.resolve() if args.wheel else None, args.python, args.doc)
    except TrialFailed as exc:
        print(f"FAILED: {exc}\n(logs kept in {folder})", file=sys.stderr)
        return 1
    print("\n".join(report))
    if not args.keep and args.folder is None:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
