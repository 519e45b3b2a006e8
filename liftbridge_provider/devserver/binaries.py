"""Locate the Liftbridge and NATS server binaries that the project installs.

Search order for each binary: an environment variable (``LIFTBRIDGE_BIN``,
``NATS_SERVER_BIN``), ``$LIFTBRIDGE_TOOLS_BIN``, the project's ``.tools/bin``
found by walking up from the current directory and from this package, then
``PATH``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from liftbridge_provider.devserver.errors import DevServerError

INSTALL_HINT = (
    "Install the pinned servers with `make tools` (it runs tools/install-servers.sh: "
    "`go install` of github.com/liftbridge-io/liftbridge and nats-server into .tools/bin), "
    "or point {env} at an existing binary."
)


def _candidate_tool_dirs() -> list[Path]:
    dirs: list[Path] = []
    if os.environ.get("LIFTBRIDGE_TOOLS_BIN"):
        dirs.append(Path(os.environ["LIFTBRIDGE_TOOLS_BIN"]))
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for folder in (start, *start.parents):
            dirs.append(folder / ".tools" / "bin")
    return dirs


def find_binary(name: str, env_var: str, hint: str = INSTALL_HINT) -> Path:
    """Return the path of server binary ``name``; raise DevServerError saying how to install it (``hint``,
    with ``{env}`` for ``env_var``)."""
    explicit = os.environ.get(env_var)
    if explicit:
        path = Path(explicit)
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise DevServerError(f"{env_var}={explicit!r} is not an executable file. " + hint.format(env=env_var))
    looked = _candidate_tool_dirs()
    for folder in looked:
        path = folder / name
        if path.is_file() and os.access(path, os.X_OK):
            return path
    on_path = shutil.which(name)
    if on_path:
        return Path(on_path)
    where = ", ".join(dict.fromkeys(str(d) for d in looked[:3]))
    raise DevServerError(
        f"{name} binary not found (looked in {env_var}, {where}, ... and PATH). " + hint.format(env=env_var)
    )


def liftbridge_binary() -> Path:
    """The Liftbridge server binary."""
    return find_binary("liftbridge", "LIFTBRIDGE_BIN")


def nats_server_binary() -> Path:
    """The NATS server binary (used as the shared NATS of a multi-node cluster)."""
    return find_binary("nats-server", "NATS_SERVER_BIN")


@functools.cache
def liftbridge_version(binary: Path) -> str:
    """The version the binary reports, e.g. ``"v1.9.0"`` (``"dev"`` for builds of main)."""
    result = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False)
    match = re.search(r"version\s+(\S+)", result.stdout + result.stderr)
    if result.returncode != 0 or match is None:
        raise DevServerError(f"{binary} --version failed: {(result.stdout + result.stderr).strip()!r}")
    return match.group(1)


def has_telemetry(version: str) -> bool:
    """Whether this server version knows the ``telemetry.*`` settings.

    Releases up to v1.9.x have no telemetry and refuse unknown keys; builds
    after them (CalVer, or ``dev`` from main) send telemetry unless disabled.
    """
    return re.match(r"v?1\.\d+\.\d+$", version) is None
