"""A runner that misbehaves inside fused batches fails only the requests it misbehaved for; nothing gets stuck.

``ChaosRunner`` (tests/support/runners.py) raises before, during or after the forward, returns the wrong number
of image lists, the wrong number of images, a non-image object, or an image PNG cannot encode, whenever a prompt
of the forward carries the matching marker. Each fault is put into its own fused batch of 4 (max_num_seqs 4; a
distinct guidance scale per group gives each group its own compatibility key, so strict FIFO batching keeps the
groups apart), at a different position, with 3 innocent peers.

Wrong number of lists is a fault of the whole forward: it cannot be pinned on one request. The culprit must end
``failed`` (RunnerError); its peers either succeed (the worker re-ran the batch one by one) or fail with
RunnerError too (the batch failed as a whole) - both are allowed by the design, the test reports which happened.
Every other peer must succeed.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.chaos.conftest import FleetFactory, RedisFactory
from tests.support.chaos import Finish, FinishedWatcher, assert_every_request_ended_once, body
from tests.support.runners import (
    NOT_AN_IMAGE,
    PNG_FAILS,
    RAISE_AFTER,
    RAISE_BEFORE,
    RAISE_DURING,
    WRONG_COUNT,
    WRONG_LISTS,
)

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

GROUP = 4

# marker -> (error type, words the error message must contain); None = any non-empty type/message
FAULTS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    RAISE_BEFORE: ("ChaosError", ("before the forward",)),
    RAISE_DURING: ("ChaosError", ("during the forward",)),
    RAISE_AFTER: ("ChaosError", ("after the forward",)),
    WRONG_LISTS: ("RunnerError", ()),
    WRONG_COUNT: ("RunnerError", ("image",)),
    NOT_AN_IMAGE: ("RunnerError", ()),
    PNG_FAILS: (None, ()),  # PIL: "cannot write mode CMYK as PNG", possibly wrapped
}


def test_runner_faults_fail_only_their_requests(chaos_redis: RedisFactory, chaos_fleet: FleetFactory) -> None:
    started = time.monotonic()
    server = chaos_redis()
    fleet = chaos_fleet(server, workers=1, FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS="300")

    bodies: list[dict[str, Any]] = []
    culprit_of: dict[int, str] = {}  # body index -> marker
    groups: list[tuple[str | None, list[int]]] = []
    for g, marker in enumerate([*FAULTS, None]):  # the last group has no fault at all
        indices = []
        for position in range(GROUP):
            index = len(bodies)
            prompt = f"group {g} request {position}"
            if marker is not None and position == g % GROUP:
                prompt = f"{prompt} {marker}"
                culprit_of[index] = marker
            bodies.append(body(prompt, guidance_scale=1.0 + g / 2))
            indices.append(index)
        groups.append((marker, indices))

    with FinishedWatcher(server.url, fleet.keys) as watcher:
        ids = fleet.submit_batch(bodies)
        culprits = {ids[i]: marker for i, marker in culprit_of.items()}
        wrong_lists_batch = {ids[i] for marker, indices in groups if marker == WRONG_LISTS for i in indices}

        def expect(rid: str, finish: Finish) -> str | None:
            marker = culprits.get(rid)
            if marker is None:
                if rid in wrong_lists_batch and finish.status == "failed" and finish.error_type == "RunnerError":
                    return None  # the whole forward's output was unusable
                return None if finish.status == "succeeded" else f"innocent peer ended {finish}"
            error_type, words = FAULTS[marker]
            if finish.status != "failed":
                return f"{marker}: ended {finish.status}, expected failed"
            if not finish.error_type or not finish.error_message:
                return f"{marker}: failed without an error type and message: {finish}"
            if error_type is not None and finish.error_type != error_type:
                return f"{marker}: error type {finish.error_type!r}, expected {error_type!r} ({finish.error_message})"
            missing = [w for w in words if w not in finish.error_message]
            return f"{marker}: error message {finish.error_message!r} lacks {missing}" if missing else None

        finishes = assert_every_request_ended_once(fleet, watcher, ids, timeout=60, expect=expect)

    png = finishes[next(rid for rid, m in culprits.items() if m == PNG_FAILS)]
    assert png.error_message and ("PNG" in png.error_message or "CMYK" in png.error_message), png
    # each group really ran as one fused batch of 4
    for marker, indices in groups:
        states = [fleet.get(ids[i]) for i in indices]
        assert len({s["batch_id"] for s in states}) == 1, (marker, states)
        assert {s["batch_size"] for s in states} == {GROUP}, (marker, states)
    peers = [finishes[rid].status for rid in wrong_lists_batch if rid not in culprits]
    print(f"wrong-lists peers ended {peers}; runner faults took {time.monotonic() - started:.1f}s")
