"""fusefleet: a request-batching diffusion serving fleet. ``fusefleet.local(...)`` embeds one in a Python program
(``fusefleet.local_fleet``); ``fusefleet.client`` talks to a running one."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``fusefleet.local``, imported on first use (``import fusefleet`` stays light)."""
    if name == "local":
        from fusefleet.local_fleet import local

        return local
    raise AttributeError(f"module 'fusefleet' has no attribute {name!r}")
