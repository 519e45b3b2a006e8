"""What installing this package next to other Airflow providers would downgrade: pip's resolver, dry runs only.

Usage: python tools/resolve_next_to.py [--python python3.11] [--wheel WHEEL] [--extras airflow] [PROVIDER ...]

For each provider (default: the Snowflake, Google, Amazon, Kubernetes, Spark
and Kafka providers) pip resolves, in a scratch virtual environment of the
chosen Python and without installing anything (``pip install --dry-run
--report``), the provider alone and the provider with this package's
requirements: the ``Requires-Dist`` of the built wheel (``make wheel``; with
``--extras``, those of the extras too). The wheel adds no constraint of its
own beyond them, and its requirements resolve for any Python, where the wheel
file (tagged for one Python, it carries the compiled decoder) would not. A
package the second resolution picks at a lower version than the first is one
this package downgrades; the goal is none (README, "Versions"). Prints a
Markdown table, one row per provider; exits 1 when anything is downgraded.
Needs the network (or pip's cache): pip reads the index's metadata.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PROVIDERS = [
    "apache-airflow-providers-snowflake",
    "apache-airflow-providers-google",
    "apache-airflow-providers-amazon",
    "apache-airflow-providers-cncf-kubernetes",
    "apache-airflow-providers-apache-spark",
    "apache-airflow-providers-apache-kafka",
]


@dataclass(frozen=True)
class Outcome:
    """One provider's two resolutions: versions by canonical name, alone and with this package."""

    provider: str
    alone: dict[str, Version]
    with_us: dict[str, Version]

    def downgraded(self) -> dict[str, tuple[Version, Version]]:
        """Packages the resolution with this package picks lower: name -> (alone, with us)."""
        return {
            name: (version, self.with_us[name])
            for name, version in sorted(self.alone.items())
            if name in self.with_us and self.with_us[name] < version
        }


def wheel_requirements(wheel: Path, extras: list[str]) -> list[str]:
    """The wheel's ``Requires-Dist`` that apply without extras or with one of ``extras`` (markers kept off)."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode().splitlines()
    found = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.removeprefix("Requires-Dist:").strip())
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in extras):
            requirement.marker = None
            found.append(str(requirement))
    return found


def resolve(python: Path, requirements: list[str], report: Path) -> dict[str, Version]:
    """Versions pip would install for ``requirements`` into an empty environment."""
    command = [str(python), "-m", "pip", "install", "--dry-run", "--quiet", "--disable-pip-version-check"]
    command += ["--ignore-installed", "--report", str(report), *requirements]
    subprocess.run(command, check=True)
    installs = json.loads(report.read_text())["install"]
    return {canonicalize_name(i["metadata"]["name"]): Version(i["metadata"]["version"]) for i in installs}


def table(outcomes: list[Outcome], python_version: str, ours: list[str]) -> str:
    rows = [
        f"Python {python_version}; this package's requirements: {', '.join(ours)}",
        "",
        "| next to | resolved alone | downgraded by this package |",
        "|---|---|---|",
    ]
    for outcome in outcomes:
        name = canonicalize_name(outcome.provider)
        alone = outcome.alone.get(name)
        downs = outcome.downgraded()
        said = ", ".join(f"{n} {a} → {w}" for n, (a, w) in downs.items()) or "nothing"
        rows.append(f"| {outcome.provider} | {alone} | {said} |")
    return "\n".join(rows)


def newest_wheel() -> Path:
    wheels = sorted((ROOT / "dist").glob("airflow_provider_liftbridge-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise SystemExit("no wheel in dist/: run make wheel (or pass --wheel)")
    return wheels[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="python3.11", help="the Python to resolve for (default python3.11)")
    parser.add_argument("--wheel", type=Path, help="default: the newest dist/airflow_provider_liftbridge-*.whl")
    parser.add_argument("--extras", default="", help="comma-separated extras of this package to add")
    parser.add_argument("providers", nargs="*", default=PROVIDERS)
    args = parser.parse_args(argv)
    ours = wheel_requirements(args.wheel or newest_wheel(), [e for e in args.extras.split(",") if e])
    with tempfile.TemporaryDirectory() as tmp:
        env = Path(tmp) / "env"
        subprocess.run([args.python, "-m", "venv", str(env)], check=True)
        python = env / "bin" / "python"
        quiet = ["--quiet", "--disable-pip-version-check"]
        subprocess.run([str(python), "-m", "pip", "install", *quiet, "--upgrade", "pip"], check=True)
        version = subprocess.run(
            [str(python), "-c", "import platform; print(platform.python_version())"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        outcomes = []
        for provider in args.providers:
            alone = resolve(python, [provider], Path(tmp) / "alone.json")
            with_us = resolve(python, [provider, *ours], Path(tmp) / "with.json")
            outcomes.append(Outcome(provider, alone, with_us))
            print(f"resolved next to {provider}", file=sys.stderr)
    print(table(outcomes, version, ours))
    return 1 if any(o.downgraded() for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
