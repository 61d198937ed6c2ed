"""``GET /metrics``: submission counters and the fleet gauges read from Redis at scrape time (api/metrics.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support import prometheus
from tests.support.api import Api

pytestmark = pytest.mark.anyio


async def _scrape(api: Api) -> dict[str, float]:
    """Every sample of ``/metrics``, by name plus labels (``name{label=value}``)."""
    response = await api.http.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return prometheus.samples(response.text)


async def test_an_idle_fleet(api: Api) -> None:
    samples = await _scrape(api)
    assert samples["fusefleet_up"] == 1
    assert samples["fusefleet_queue_depth"] == 0
    assert samples["fusefleet_oldest_waiting_seconds"] == 0
    assert samples["fusefleet_batches_in_flight"] == 0
    assert samples["fusefleet_workers_live"] == 0
    assert samples["fusefleet_api_requests_submitted_total"] == 0
    assert samples["fusefleet_api_requests_refused_total{reason=invalid}"] == 0
    assert samples["fusefleet_api_requests_refused_total{reason=queue_full}"] == 0


async def test_submitted_requests_are_counted_and_queued(api: Api) -> None:
    assert (await api.http.post("/v1/requests", json={"prompt": "a cat"})).status_code == 202
    batch = {"requests": [{"prompt": "a dog"}, {"prompt": "a fox"}]}
    assert (await api.http.post("/v1/requests/batch", json=batch)).status_code == 202
    await asyncio.sleep(0.05)
    samples = await _scrape(api)
    assert samples["fusefleet_api_requests_submitted_total"] == 3
    assert samples["fusefleet_queue_depth"] == 3
    assert 0 < samples["fusefleet_oldest_waiting_seconds"] < 60


async def test_refusals_are_counted_by_reason(api: Api) -> None:
    too_wide = await api.http.post("/v1/requests", json={"prompt": "a cat", "width": 1024})
    assert too_wide.status_code == 422
    overflow = {"requests": [{"prompt": "a cat"}] * (api.settings.max_queue_len + 1)}
    assert (await api.http.post("/v1/requests/batch", json=overflow)).status_code == 503
    samples = await _scrape(api)
    assert samples["fusefleet_api_requests_refused_total{reason=invalid}"] == 1
    assert samples["fusefleet_api_requests_refused_total{reason=queue_full}"] == 1
    assert samples["fusefleet_api_requests_submitted_total"] == 0


async def test_live_workers_and_batches_in_flight(api: Api) -> None:
    now_ms = time.time() * 1000
    stale_ms = now_ms - (api.settings.worker_ttl_s + 10) * 1000
    await api.redis.zadd(api.keys.workers, {"w-live": now_ms, "w-stale": stale_ms})
    await api.redis.zadd(api.keys.inflight, {"b1": now_ms})
    samples = await _scrape(api)
    assert samples["fusefleet_workers_live"] == 1
    assert samples["fusefleet_batches_in_flight"] == 1


async def test_redis_down_is_up_0_not_a_500(api: Api) -> None:
    assert (await api.http.post("/v1/requests", json={"prompt": "a cat"})).status_code == 202
    api.server.connected = False
    samples = await _scrape(api)
    assert samples["fusefleet_up"] == 0
    assert "fusefleet_queue_depth" not in samples
    assert samples["fusefleet_api_requests_submitted_total"] == 1  # the process's own counters still export
    api.server.connected = True
    samples = await _scrape(api)
    assert samples["fusefleet_up"] == 1
    assert samples["fusefleet_queue_depth"] == 1


async def test_metrics_is_not_in_the_openapi_schema(api: Api) -> None:
    assert "/metrics" not in (await api.http.get("/openapi.json")).json()["paths"]
