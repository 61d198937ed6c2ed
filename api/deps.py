"""FastAPI dependencies: what ``api.app`` keeps on ``app.state`` (settings, request store, waiter...), as
``Annotated`` aliases for routes. ``app_state`` makes one such dependency; a route module keeps its own alias."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

from fastapi import Depends, Request

from api.store import RequestStore
from api.waiter import CompletionWaiter
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
get_store = app_state("store", RequestStore)
get_waiter = app_state("waiter", CompletionWaiter)

SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[RequestStore, Depends(get_store)]
WaiterDep = Annotated[CompletionWaiter, Depends(get_waiter)]
