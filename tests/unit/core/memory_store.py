"""An in-memory LedgerStore for the ledger's pure tests: atomic create-if-absent, delete, single-object rename.

``before_create`` runs before the next create (a racing writer slipped in);
``before_op``, when set, runs before every operation (the randomized tests'
scheduler uses it to switch writers and to kill one at any point). ``ops``
counts the operations by kind, as the Spark job's CountingStore does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from liftbridge_provider.core.lake import MissingFileError


class MemoryStore:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.before_create: Callable[[str], None] | None = None
        self.before_op: Callable[[str, str], None] | None = None
        self.ops: Counter[str] = Counter()

    def _op(self, kind: str, path: str) -> None:
        self.ops[kind] += 1
        if self.before_op is not None:
            self.before_op(kind, path)

    def list_names(self, folder: str) -> list[str]:
        self._op("list", folder)
        prefix = folder.rstrip("/") + "/"
        return sorted({p[len(prefix) :].split("/", 1)[0] for p in self.files if p.startswith(prefix)})

    def read(self, path: str) -> bytes:
        self._op("read", path)
        if path not in self.files:
            raise MissingFileError(f"{path} does not exist")
        return self.files[path]

    def create_exclusive(self, path: str, data: bytes) -> bool:
        self._op("create", path)
        if self.before_create is not None:
            hook, self.before_create = self.before_create, None
            hook(path)
        if path in self.files:
            return False
        self.files[path] = data
        return True

    def delete_files(self, folder: str, names: Sequence[str]) -> None:
        self._op("delete", folder)
        for name in names:
            self.files.pop(f"{folder}/{name}", None)

    def object_size(self, path: str) -> int | None:
        self._op("size", path)
        if path in self.files:
            return len(self.files[path])
        return -1 if any(p.startswith(path + "/") for p in self.files) else None

    def rename(self, source: str, target: str) -> bool:
        self._op("rename", source)
        if source not in self.files or target in self.files:
            return False
        self.files[target] = self.files.pop(source)
        return True

    def put(self, path: str, data: bytes) -> None:
        """A staged object written by a Spark task (not a ledger operation)."""
        self.files[path] = data
