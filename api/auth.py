"""Bearer-token authentication with API keys (``FUSEFLEET_API_KEYS_FILE``, parsed by ``shared.api_keys``).

Without a keys file nothing here does anything: ``authenticate`` answers None and every request is anyone's.
With one, ``authenticate`` (a dependency of every router but ``/healthz`` and ``/metrics``) wants
``Authorization: Bearer <token>``: no token (or another scheme) and an unknown token are a 401 with
``WWW-Authenticate: Bearer``, in the native shape (``{"detail": ...}``) or, on the OpenAI routes, in OpenAI's
(``api.openai.errors``). The key it finds is the caller: its name is recorded on what it submits, and a request of
another key is answered exactly as an unknown one (404), so a key cannot even learn that another key's request
exists. There is no 403.

The file is read when the app is built (an invalid one stops the api) and again when it changes: each call looks at
the file's stat at most every ``RELOAD_CHECK_S``. A change that does not parse (a half-written file, a typo) is
logged and the keys read before stay in force, so an edit can neither lock every client out nor open the api.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, status

from shared.api_keys import ApiKey, KeyRing, KeysFileError, load_keys
from shared.wire import ErrorMessage

log = logging.getLogger(__name__)

RELOAD_CHECK_S = 1.0
"""Longest time a change of the keys file goes unseen by an api process."""
BEARER = "bearer"

FileStamp = tuple[int, int, int] | None
"""What tells a changed file: inode, size and modification time (ns); None when it cannot be stat'ed."""


class KeyRefused(HTTPException):
    """A call refused because of its API key: 401 (no key, unknown key) or 429 (one of the key's limits).

    ``code`` is the OpenAI ``code`` of the answer on the OpenAI routes."""

    def __init__(self, status_code: int, detail: str, code: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(status_code, detail=detail, headers=headers)
        self.code = code


def _unauthorized(detail: str, code: str, challenge: str) -> KeyRefused:
    """A 401 whose ``WWW-Authenticate`` header is ``challenge``."""
    return KeyRefused(status.HTTP_401_UNAUTHORIZED, detail, code, {"WWW-Authenticate": challenge})


def missing_key() -> KeyRefused:
    return _unauthorized("this api needs an API key: send 'Authorization: Bearer <key>'", "missing_api_key", "Bearer")


def invalid_key() -> KeyRefused:
    return _unauthorized("invalid API key (unknown, or revoked)", "invalid_api_key", 'Bearer error="invalid_token"')


class KeysWatcher:
    """The keys of the file at ``path``, read again when the file changes.

    ``current`` looks at the file's stat at most every ``RELOAD_CHECK_S`` of ``clock``; a file that changed is
    parsed again, and one that cannot be read or parsed leaves the previous keys in force (logged once per change).
    Constructing it reads the file: ``KeysFileError`` when that fails.
    """

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._stamp = self._stat()
        self._ring = load_keys(path)
        self._checked = clock()

    def current(self) -> KeyRing:
        now = self._clock()
        if now - self._checked >= RELOAD_CHECK_S:
            self._checked = now
            stamp = self._stat()
            if stamp != self._stamp:
                self._stamp = stamp
                self._reload()
        return self._ring

    def _reload(self) -> None:
        try:
            ring = load_keys(self.path)
        except KeysFileError as exc:
            log.error("%s; the %d API keys read before stay in force", exc, len(self._ring.keys))
            return
        self._ring = ring
        log.info("API keys file %s read again: %d keys", self.path, len(ring.keys))

    def _stat(self) -> FileStamp:
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def keys_watcher(path: Path | None) -> KeysWatcher | None:
    """The watcher of the keys file ``path`` (``Settings.api_keys_file``); None without one (no authentication)."""
    if path is None:
        return None
    watcher = KeysWatcher(path)
    count = len(watcher.current().keys)
    log.info("API keys: %d read from %s; every endpoint but /healthz and /metrics needs one", count, path)
    return watcher


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value; None without one."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == BEARER and token else None


async def authenticate(request: Request) -> ApiKey | None:
    """The caller's API key; None when the api has no keys file. ``KeyRefused`` (401) without a valid one."""
    watcher: KeysWatcher | None = request.app.state.api_keys
    if watcher is None:
        return None
    token = bearer_token(request.headers.get("authorization"))
    if token is None:
        raise missing_key()
    key = watcher.current().find(token)
    if key is None:
        raise invalid_key()
    return key


async def owner(caller: Annotated[ApiKey | None, Depends(authenticate)]) -> str | None:
    """The name of the caller's key: only requests recorded under it are the caller's. None: every request is."""
    return caller.name if caller is not None else None


CallerDep = Annotated[ApiKey | None, Depends(authenticate)]
OwnerDep = Annotated[str | None, Depends(owner)]
AUTHENTICATED = [Depends(authenticate)]
"""The ``dependencies`` of a router every call of which needs a key (when the api has them)."""

UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: {
        "model": ErrorMessage,
        "description": "No API key, or an unknown one (this api has API keys: send 'Authorization: Bearer <key>').",
        "headers": {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    }
}
"""The 401 of every authenticated route, for the OpenAPI document of an api that has keys."""
