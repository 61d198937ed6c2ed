"""A private Redis-compatible server on a free port for one test session (never the machine's shared one)."""

from __future__ import annotations

from fusefleet.valkey import EmbeddedValkey as RedisServer
from fusefleet.valkey import free_port

__all__ = ["RedisServer", "free_port"]
