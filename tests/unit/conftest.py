"""Fixtures of the api unit tests: the app in-process on fakeredis; a module overrides ``settings`` for its own
limits, and ``api`` follows."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shared.settings import Settings
from tests.support.api import Api, api_harness, unit_settings


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return unit_settings(tmp_path)


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[Api]:
    async for harness in api_harness(settings):
        yield harness
