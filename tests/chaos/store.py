"""Where a seed's lakes live: a local folder, or a bucket of the session's real S3 gateway (S3A for Spark).

Even seeds put their Parquet lake and their Delta table on S3 (``s3a://<bucket>/lake``, ``.../delta``) and
odd seeds on a local disk, unless ``--chaos-store`` says ``local`` or ``s3`` for every seed; the choice never
draws from the seed's random plan, so plans stay what they were. On S3 a folder rename is a copy of each
object, then a delete, and a claim is a conditional put: the harness's ``crash`` steps (tests/chaos/crash.py)
kill the driver between those requests too.

The harness reads back what readers see with pyarrow's filesystem of the same store (the one
:class:`~liftbridge_provider.core.object_store.S3Settings` of the gateway), never through the job's code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pyarrow import fs

from liftbridge_provider.core.object_store import S3Settings
from liftbridge_provider.delta_table import table_path
from liftbridge_provider.devserver.s3 import S3Server

STORES = ("seed", "local", "s3")


def store_of(seed: int, choice: str) -> str:
    """``local`` or ``s3`` for ``seed`` (pure): ``choice`` itself, or by the seed's parity for ``seed``."""
    if choice not in STORES:
        raise ValueError(f"--chaos-store must be one of {', '.join(STORES)}, got {choice!r}")
    if choice != "seed":
        return choice
    return "s3" if seed % 2 == 0 else "local"


@dataclass(frozen=True)
class SeedStore:
    """One seed's lake location: ``uri(name)`` for the job's ``--output``, pyarrow's filesystem for reading."""

    kind: str  # "local" or "s3"
    base: str  # a local folder, or "<bucket>" on the gateway
    settings: S3Settings | None = None
    filesystem: Any = field(default=None, compare=False)

    def uri(self, name: str) -> str:
        """What the ingest job gets as ``--output`` for the lake ``name`` (``lake``, ``delta``)."""
        if self.kind == "s3":
            return f"s3a://{self.base}/{name}"
        return str(Path(self.base) / name)

    def delta_uri(self, name: str) -> str:
        """The Delta table ``name`` as delta-rs opens it (``s3://`` on S3)."""
        return table_path(self.uri(name))

    def delta_options(self) -> dict[str, str] | None:
        """delta-rs's storage options for this store (None on a local disk)."""
        return None if self.settings is None else self.settings.delta_storage_options()

    def fs_path(self, uri: str) -> str:
        """pyarrow's path of a job path or URI (``file:/x``, ``/x``, ``s3a://bucket/key``)."""
        parts = urlsplit(uri)
        if parts.scheme in ("s3a", "s3", "s3n"):
            return f"{parts.netloc}{parts.path}".rstrip("/")
        return parts.path if parts.scheme == "file" else uri

    def files(self, name: str) -> list[str]:
        """Every file (pyarrow path) under the lake ``name``, sorted; none before the lake exists."""
        selector = fs.FileSelector(self.fs_path(self.uri(name)), recursive=True, allow_not_found=True)
        return sorted(i.path for i in self.filesystem.get_file_info(selector) if i.type == fs.FileType.File)

    def relative(self, name: str, path: str) -> str:
        """``path`` (a pyarrow path from :meth:`files`) relative to the lake ``name``."""
        return path[len(self.fs_path(self.uri(name))) :].lstrip("/")

    def copy(self, source: str, target: str) -> None:
        """Copy one object (job paths or URIs): the first half of a rename on S3 (CopyObject); on a local disk
        the target's folder is made first, as the job's own rename makes it."""
        target_path = self.fs_path(target)
        if self.kind == "local":
            self.filesystem.create_dir(target_path.rpartition("/")[0], recursive=True)
        self.filesystem.copy_file(self.fs_path(source), target_path)


def local_store(folder: Path) -> SeedStore:
    folder.mkdir(parents=True, exist_ok=True)
    return SeedStore("local", str(folder), None, fs.LocalFileSystem())


def s3_store(server: S3Server) -> SeedStore:
    """A new bucket on the session's gateway."""
    settings = server.settings
    return SeedStore("s3", server.create_bucket(), settings, fs.S3FileSystem(**settings.pyarrow_options()))
