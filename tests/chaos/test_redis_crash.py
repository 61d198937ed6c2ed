"""Redis crashes (SIGKILL) with ~40 requests in flight and comes back on the same port 3 s later.

Redis runs append-only with ``appendfsync always`` in its own data directory, so every accepted request (the 202
is sent after its SUBMIT script returned) is on disk. While it is down the api answers 503 with Retry-After
within a few seconds (never 500, never a hang). After the restart every accepted request ends ``succeeded``,
none ends twice, and new requests are served. The ``P:finished`` subscription drops with the server, so
publications during the outage may be missed: "at most once" plus the status read back.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.chaos.conftest import FleetFactory, RedisFactory
from tests.support.chaos import (
    FinishedWatcher,
    assert_every_request_ended_once,
    body,
    redis_down_answer,
    statuses,
    submit_all,
)
from tests.support.fleet import Fleet
from tests.support.processes import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

IN_FLIGHT = 40
OUTAGE_S = 3.0
ANSWER_WITHIN_S = 5.0  # "a few seconds": the api's Redis timeouts, not a hang


def test_redis_sigkill_and_restart_loses_no_accepted_request(
    chaos_redis: RedisFactory, chaos_fleet: FleetFactory
) -> None:
    started = time.monotonic()
    server = chaos_redis(persistent=True, appendfsync="always")
    fleet = chaos_fleet(
        server,
        workers=2,
        FUSEFLEET_SIM_BASE_MS="400",
        FUSEFLEET_SIM_PER_IMAGE_MS="50",
    )
    with FinishedWatcher(server.url, fleet.keys) as watcher:
        ids = submit_all(fleet, [body(f"crash {i}") for i in range(IN_FLIGHT)])
        # a few batches running (two workers x 4), the rest queued
        wait_for(
            lambda: statuses(fleet, ids)["running"] >= 5, 30, f"two batches to run ({fleet.logs_hint()})", interval=0.02
        )
        assert len(watcher.unseen(ids)) > IN_FLIGHT // 2, "too many requests ended before the crash"

        server.kill()
        killed_at = time.monotonic()
        submit, submit_s = redis_down_answer(fleet, lambda c: c.post("/v1/requests", json=body("during the outage")))
        get, get_s = redis_down_answer(fleet, lambda c: c.get(f"/v1/requests/{ids[-1]}"))
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - killed_at)))
        server.start()
        restarted_at = time.monotonic()

        for what, response, took in (("submit", submit, submit_s), ("status", get, get_s)):
            assert response.status_code == 503, f"{what} during the outage: {response.status_code} {response.text}"
            assert "retry-after" in response.headers, f"{what} during the outage: no Retry-After"
            assert took <= ANSWER_WITHIN_S, f"{what} during the outage took {took:.1f}s"

        # appendfsync always: every accepted request survived the crash
        survived = sum(fleet.redis.exists(fleet.keys.request(rid)) for rid in ids)
        assert survived == len(ids), f"only {survived} of {len(ids)} accepted requests survived the crash"

        after = _submit_when_ready(fleet, [body(f"after the restart {i}") for i in range(8)])
        assert_every_request_ended_once(fleet, watcher, ids + after, timeout=120)
        recovered_s = time.monotonic() - restarted_at
    print(
        f"redis crash: 503 in {submit_s:.2f}s (submit) / {get_s:.2f}s (status); {watcher.drops} subscription "
        f"drops; all ended and a new one served {recovered_s:.1f}s after the restart; "
        f"took {time.monotonic() - started:.1f}s"
    )


def _submit_when_ready(fleet: Fleet, bodies: list[dict[str, Any]]) -> list[str]:
    """Submit right after the restart: the api may answer 503 for a moment while it reconnects."""
    deadline = time.monotonic() + 15
    while True:
        try:
            response = fleet.http.post("/v1/requests/batch", json={"requests": bodies})
        except httpx.HTTPError:
            response = None
        if response is not None and response.status_code == 202:
            return [str(rid) for rid in response.json()["ids"]]
        assert response is None or response.status_code == 503, response.text
        assert time.monotonic() < deadline, "the api did not accept requests within 15 s of Redis' restart"
        time.sleep(0.2)
