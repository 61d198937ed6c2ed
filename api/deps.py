"""FastAPI dependencies: the app's settings and request store, as ``Annotated`` aliases for routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from api.store import RequestStore
from api.waiter import CompletionWaiter
from shared.settings import Settings


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_store(request: Request) -> RequestStore:
    store: RequestStore = request.app.state.store
    return store


async def get_waiter(request: Request) -> CompletionWaiter:
    waiter: CompletionWaiter = request.app.state.waiter
    return waiter


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[RequestStore, Depends(get_store)]
WaiterDep = Annotated[CompletionWaiter, Depends(get_waiter)]
