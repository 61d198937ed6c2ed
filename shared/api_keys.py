"""The API keys file (``FUSEFLEET_API_KEYS_FILE``): which bearer tokens the api accepts, under which names, with
which limits. Parsing, hashing and minting only (no I/O but reading the file); ``api.auth`` serves it,
``fusefleet keys`` (``fusefleet.keys_cli``) writes it.

TOML, one table per key under ``keys``, named by the key's name::

    [keys.alice]
    sha256 = "5e2b...64 hex digits"   # the sha256 of the token; the token itself is stored nowhere
    rate_per_s = 2.0                  # optional: submitted requests per second, sustained (a token bucket)
    burst = 10                        # optional, with rate_per_s: requests at once (default: rate_per_s rounded up)
    max_queued = 50                   # optional: requests queued, scheduled or running at once
    share = 2.0                       # optional: its weight in the fair order (scheduling_policy = "fair"), default 1

``fusefleet keys new NAME`` mints a token and prints it once, with the table to add. Tokens are random (256
bits, ``new_token``), so a plain sha256 of the token is the right hash: there is nothing to brute-force, so no salt
or slow hash is needed. A presented token is hashed and compared with every key's hash by
``hmac.compare_digest``.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
"""A key's name: recorded on its requests, part of Redis key names, a bare TOML key."""
TOKEN_PREFIX = "ff_"
"""Starts every minted token, so a leaked one is recognisable (secret scanners, logs)."""
TOKEN_BYTES = 32

KeyName = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]


class KeysFileError(ValueError):
    """The keys file cannot be read or is invalid; the message names the file and each bad entry."""


class KeyLimits(BaseModel):
    """One table of the file: a key's token hash and its optional limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] = Field(
        description="Lower-case hex sha256 of the token."
    )
    rate_per_s: float | None = Field(None, gt=0, le=1_000_000, description="Submitted requests per second.")
    burst: int | None = Field(None, ge=1, le=1_000_000, description="Requests at once (the bucket's size).")
    max_queued: int | None = Field(None, ge=1, le=1_000_000, description="Unfinished requests at once.")
    share: float = Field(1.0, gt=0, le=1_000_000, description="Its weight in the fair order (scheduling_policy).")

    @model_validator(mode="after")
    def _burst_needs_a_rate(self) -> KeyLimits:
        if self.burst is not None and self.rate_per_s is None:
            raise ValueError("burst needs rate_per_s (the rate the bucket refills at)")
        return self


class ApiKey(KeyLimits):
    """A key of the file, with its name."""

    name: KeyName

    @property
    def bucket_size(self) -> int | None:
        """Tokens of its rate-limit bucket (``burst``, default ``rate_per_s`` rounded up); None: no rate limit."""
        if self.rate_per_s is None:
            return None
        return self.burst if self.burst is not None else max(1, math.ceil(self.rate_per_s))


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: dict[KeyName, KeyLimits] = Field(default_factory=dict)


class KeyRing:
    """The keys of one version of the file."""

    def __init__(self, keys: Mapping[str, KeyLimits]) -> None:
        self.keys = tuple(ApiKey(name=name, **limits.model_dump()) for name, limits in keys.items())
        by_hash: dict[str, str] = {}
        for key in self.keys:
            if key.sha256 in by_hash:
                raise KeysFileError(f"keys.{by_hash[key.sha256]} and keys.{key.name} have the same sha256")
            by_hash[key.sha256] = key.name

    def find(self, token: str) -> ApiKey | None:
        """The key whose hash is the token's, or None; every key is compared (no early exit)."""
        digest = token_hash(token)
        found = None
        for key in self.keys:
            if hmac.compare_digest(key.sha256, digest):
                found = key
        return found


def parse_keys(text: str, source: str = "the API keys file") -> KeyRing:
    """The keys of a file's text; ``KeysFileError`` naming ``source`` and every bad entry (``keys.alice.burst:
    ...``) when it is not valid TOML or not a valid keys file."""
    try:
        data: dict[str, Any] = tomllib.loads(text)
        parsed = _File.model_validate(data)
    except tomllib.TOMLDecodeError as exc:
        raise KeysFileError(f"{source} is not valid TOML: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        raise KeysFileError(f"{source} is invalid: {problems}") from None
    try:
        return KeyRing(parsed.keys)
    except KeysFileError as exc:
        raise KeysFileError(f"{source} is invalid: {exc}") from None


def load_keys(path: Path) -> KeyRing:
    """The keys of the file at ``path``; ``KeysFileError`` when it cannot be read or is invalid."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KeysFileError(f"cannot read the API keys file {path}: {exc}") from None
    return parse_keys(text, str(path))


def token_hash(token: str) -> str:
    """The hex sha256 of a token, as the keys file holds it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    """A new random token: ``ff_`` and 256 random bits, URL-safe base64."""
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def key_table(key: ApiKey) -> str:
    """The TOML table of ``key``, as ``parse_keys`` reads it back."""
    lines = [f"[keys.{key.name}]", f'sha256 = "{key.sha256}"']
    if key.rate_per_s is not None:
        lines.append(f"rate_per_s = {key.rate_per_s!r}")
    if key.burst is not None:
        lines.append(f"burst = {key.burst}")
    if key.max_queued is not None:
        lines.append(f"max_queued = {key.max_queued}")
    if key.share != 1:
        lines.append(f"share = {key.share!r}")
    return "\n".join(lines) + "\n"
