"""Concurrent submissions and reads of one api process share round trips (``api.coalescer`` in ``RequestStore``),
and each submission is still accepted or refused on its own: the app on fakeredis, served in-process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.api import api_harness, unit_settings

pytestmark = pytest.mark.anyio


async def test_concurrent_submissions_share_script_calls_and_a_full_queue_refuses_only_the_ones_past_it(
    tmp_path: Path,
) -> None:
    async for api in api_harness(unit_settings(tmp_path, max_queue_len=5)):
        responses = await asyncio.gather(
            *(api.http.post("/v1/requests", json={"prompt": f"cat {i}"}) for i in range(7))
        )
        codes = sorted(response.status_code for response in responses)
        assert codes == [202] * 5 + [503] * 2, [r.text for r in responses]
        accepted = [r.json()["id"] for r in responses if r.status_code == 202]
        queued = [entry[1]["id"] for entry in await api.redis.xrange(api.keys.requests)]
        assert sorted(queued) == sorted(accepted) and len(set(accepted)) == 5
        refused = next(r for r in responses if r.status_code == 503)
        assert "queue" in refused.text
        store = api.app.state.store
        assert store._submissions.flushes < 7  # several submissions rode one call


async def test_concurrent_reads_share_one_pipeline_and_each_gets_its_own_state(tmp_path: Path) -> None:
    async for api in api_harness(unit_settings(tmp_path)):
        ids = []
        for i in range(4):
            response = await api.http.post("/v1/requests", json={"prompt": f"dog {i}"})
            ids.append(response.json()["id"])
        store = api.app.state.store
        before = store._reads.flushes
        reads = await asyncio.gather(*(api.http.get(f"/v1/requests/{rid}") for rid in [*ids, "f" * 32]))
        assert [r.status_code for r in reads] == [200] * 4 + [404]
        assert [r.json()["id"] for r in reads[:4]] == ids
        assert store._reads.flushes - before < 5
