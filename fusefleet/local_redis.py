"""Where the other commands find the Redis of a running ``fusefleet up``.

``fusefleet up`` starts its embedded Valkey on a free port and writes ``<state dir>/redis.json`` (the URL and the
server's process id; ``./.fusefleet/redis.json`` by default); it removes the file when it stops. A command that
reads Redis (``fusefleet status``) uses, in this order: ``FUSEFLEET_REDIS_URL`` when set, else the URL of that file
while its server is alive, else the default ``redis_url``. A file left behind by a killed ``up`` names a dead
process and is ignored.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from shared.settings import Settings

STATE_DIR = Path(".fusefleet")
"""The default state dir of ``fusefleet up`` (and where ``fusefleet status`` looks), relative to the current folder."""
POINTER_FILE = "redis.json"
REDIS_URL_VARIABLE = "FUSEFLEET_REDIS_URL"


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists (signal 0 checks without signalling)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, run by someone else
        return True
    return True


@dataclass(frozen=True, slots=True)
class RedisPointer:
    """The file ``fusefleet up`` leaves in its state dir: ``{"url": ..., "pid": ...}``."""

    path: Path

    @classmethod
    def in_dir(cls, state_dir: Path) -> RedisPointer:
        return cls(state_dir / POINTER_FILE)

    def write(self, url: str, pid: int) -> None:
        """Replace the file at once (written aside, then renamed), so a reader never sees half of it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        partial.write_text(json.dumps({"url": url, "pid": pid}))
        partial.replace(self.path)

    def read(self) -> str | None:
        """The URL while the process the file names is alive; None without a file, with a bad one, or a dead pid."""
        try:
            found = json.loads(self.path.read_text())
            url, pid = str(found["url"]), int(found["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return url if process_alive(pid) else None

    def remove(self, pid: int) -> None:
        """Remove the file if it still names ``pid`` (a later ``up`` in the same dir may have replaced it)."""
        try:
            if int(json.loads(self.path.read_text())["pid"]) == pid:
                self.path.unlink()
        except (OSError, ValueError, KeyError, TypeError):
            pass


def local_settings(state_dir: Path) -> tuple[Settings, str]:
    """``Settings()``, with ``redis_url`` a running ``fusefleet up``'s when the environment sets none; and where
    that URL came from (``FUSEFLEET_REDIS_URL``, ``fusefleet up, <file>`` or ``default``)."""
    settings = Settings()
    if REDIS_URL_VARIABLE in os.environ:
        return settings, REDIS_URL_VARIABLE
    pointer = RedisPointer.in_dir(state_dir)
    url = pointer.read()
    if url is None:
        return settings, "default"
    return settings.model_copy(update={"redis_url": url}), f"fusefleet up, {pointer.path}"
