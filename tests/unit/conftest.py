"""Fixtures of the unit tests.

* the api in-process on fakeredis: a module overrides ``settings`` for its own limits, and ``api`` follows;
* ``client``, a fresh fakeredis client (the real Lua scripts run on it);
* ``one_torch_thread`` and ``runner``, the real diffusers runner on the tiny demo model, for modules that
  importorskip diffusers first (torch and diffusers are imported only when a test asks for them).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import fakeredis
import pytest

from shared.settings import Settings
from tests.support.api import Api, api_harness, unit_settings

if TYPE_CHECKING:
    from gpu_worker.diffusers_runner import DiffusersRunner


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


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(decode_responses=True)


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread for the module, as it was afterwards: tiny models run fastest on one thread (two spin
    against each other on a busy 2-core machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runner(one_torch_thread: None, tmp_path_factory: pytest.TempPathFactory) -> DiffusersRunner:
    """The real runner on the demo model (built in the module's own model cache), on one torch thread."""
    from gpu_worker.diffusers_runner import DiffusersRunner

    return DiffusersRunner(Settings(model_cache_dir=tmp_path_factory.mktemp("demo-model"), torch_threads=1))
