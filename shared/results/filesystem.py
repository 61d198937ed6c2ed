"""The filesystem result store: one file per image under a folder (a volume shared by the hosts of one fleet)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Sequence
from pathlib import Path

from shared.results.store import ResultStoreError, check_key, put_each


class FilesystemResultStore:
    """Objects are files ``root/{request_id}/{token}/{index}.{format}``; a write lands whole (temporary file, then
    an atomic rename), so a reader never sees half an image."""

    kind = "filesystem"

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_bytes(data)
            os.replace(partial, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            raise ResultStoreError(f"writing {key} under {self.root} failed: {exc}") from exc

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> dict[str, ResultStoreError]:
        return put_each(self, items)

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ResultStoreError(f"reading {key} under {self.root} failed: {exc}") from exc

    def delete(self, keys: Sequence[str]) -> None:
        paths = [self._path(key) for key in keys]  # every key checked before anything is deleted
        for key, path in zip(keys, paths, strict=True):
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                raise ResultStoreError(f"deleting {key} under {self.root} failed: {exc}") from exc
            for folder in (path.parent, path.parent.parent):  # the run's folder, then the request's, once empty
                with contextlib.suppress(OSError):
                    folder.rmdir()

    def url(self, key: str) -> str | None:
        check_key(key)
        return None
