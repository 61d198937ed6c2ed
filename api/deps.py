"""FastAPI dependencies: what ``api.app`` keeps on ``app.state`` (settings, request store, waiter...), as
``Annotated`` aliases for routes. ``app_state`` makes one such dependency; a route module keeps its own alias."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

from fastapi import Depends, Request

from api.shard_router import Store, Waiter
from shared.settings import Settings

T = TypeVar("T")


def app_state(name: str, kind: type[T]) -> Callable[[Request], Awaitable[T]]:
    """A dependency that answers ``request.app.state.<name>`` (set by ``api.app``), typed as ``kind``."""

    async def dependency(request: Request) -> T:
        value: T = getattr(request.app.state, name)
        return value

    dependency.__name__ = f"get_{name}"
    dependency.__qualname__ = dependency.__name__
    return dependency


get_settings = app_state("settings", Settings)


async def get_store(request: Request) -> Store:
    """The request store: the fleet's one shard's, or every shard's behind ``api.shard_router``."""
    store: Store = request.app.state.store
    return store


async def get_waiter(request: Request) -> Waiter:
    """The completion waiter: the fleet's one shard's, or every shard's behind ``api.shard_router``."""
    waiter: Waiter = request.app.state.waiter
    return waiter


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
WaiterDep = Annotated[Waiter, Depends(get_waiter)]
