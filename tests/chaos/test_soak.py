"""Soak: many requests with mixed compatibility keys and random aborts; each ends exactly once, nothing leaks.

N requests (``--soak-count`` when pytest runs from tests/chaos, else ``FUSEFLEET_SOAK_COUNT``; default in
tests/chaos/conftest.py) go through ``POST /v1/requests/batch`` in chunks of 256, four chunks at a time, with three
compatibility keys (two sizes, two step counts) drawn at random per request, to a NullRunner worker
(max_num_seqs 64, grouped batching). About 5 % of them are aborted at random moments (while queued, running,
finished or already expired). Every request is published terminal exactly once and ends as its abort answer
says: 200 -> aborted (the flag wins over success), 409 -> succeeded, never aborted -> succeeded.

With a 3 s result TTL, Redis returns to its starting level afterwards: no ``P:req:*``, ``P:result:*`` or
``P:batch:*`` key is left, and ``used_memory`` (client buffers excluded) is back within ``MEMORY_SLACK`` of the
baseline taken after a warm-up. The slack covers what legitimately stays: the ``P:events`` stream grows from a
few entries to its cap (~1000 ``batch_done`` entries, ~100 KiB), and the allocator's and the keyspace's hash
tables do not always shrink back to their smallest size.
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from tests.chaos.conftest import FleetFactory, RedisFactory
from tests.support.chaos import (
    CHUNK,
    Finish,
    FinishedWatcher,
    assert_every_request_ended_once,
    random_bodies,
    submit_all,
)
from tests.support.fleet import Fleet
from tests.support.processes import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

SHAPES = [
    {"width": 64, "height": 64, "steps": 4},
    {"width": 128, "height": 64, "steps": 4},
    {"width": 64, "height": 64, "steps": 8},
]
ABORT_SHARE = 0.05
ABORT_DELAY_S = 1.5  # each chosen request is aborted up to this long after its submission
RESULT_TTL_S = 3
MEMORY_SLACK = 512 * 1024  # ~40 KiB measured above the baseline after 20,000 requests
LEAK_PATTERNS = ("req", "result", "batch")  # result: image objects (deleted by the sweeper once due)


def leftover_keys(fleet: Fleet) -> dict[str, int]:
    """Keys of the prefix that should expire, by kind (``req``, ``result``, ``batch``)."""
    found: Counter[str] = Counter()
    tag = fleet.keys.tag
    for key in fleet.redis.scan_iter(match=f"{tag}:*", count=1000):
        kind = key[len(tag) + 1 :].split(":", 1)[0]
        if kind in LEAK_PATTERNS:
            found[kind] += 1
    return dict(found)


def wait_no_leftovers(fleet: Fleet, after: str, timeout: float = 30) -> None:
    """Wait until no request, image or batch key is left (their TTL is 3 s); fail naming what stays."""
    left: dict[str, int] = {}

    def gone() -> bool:
        left.clear()
        left.update(leftover_keys(fleet))
        return not left

    try:
        wait_for(gone, timeout, "keys to expire", interval=0.5)
    except TimeoutError:
        raise AssertionError(
            f"{timeout:.0f}s after {after} (result TTL {RESULT_TTL_S}s) keys are left: {left}; {fleet.logs_hint()}"
        ) from None


def memory(fleet: Fleet) -> int:
    """used_memory without client buffers (those follow the api's connection pool size, not the data)."""
    info = fleet.redis.info("memory")
    return int(info["used_memory"]) - int(info.get("mem_clients_normal", 0))


class Aborter:
    """Aborts chosen requests at random moments after their submission, recording each answer."""

    def __init__(self, fleet: Fleet, rng: random.Random) -> None:
        self._http = httpx.Client(base_url=fleet.base_url, timeout=30)
        self._rng = rng
        self._due: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._done_adding = threading.Event()
        self.answers: dict[str, tuple[int, str | None]] = {}
        self._thread = threading.Thread(target=self._run, name="aborter", daemon=True)

    def start(self) -> Aborter:
        self._thread.start()
        return self

    def consider(self, ids: list[str]) -> None:
        now = time.monotonic()
        with self._lock:
            for rid in ids:
                if self._rng.random() < ABORT_SHARE:
                    heapq.heappush(self._due, (now + self._rng.uniform(0, ABORT_DELAY_S), rid))

    def finish(self, timeout: float) -> None:
        self._done_adding.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the aborter did not finish"
        self._http.close()

    def _run(self) -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            with self._lock:
                ready = self._due and self._due[0][0] <= time.monotonic()
                item = heapq.heappop(self._due) if ready else None
                empty = not self._due
            if item is None:
                if empty and self._done_adding.is_set():
                    return
                time.sleep(0.005)
                continue
            rid = item[1]
            response = self._http.post(f"/v1/requests/{rid}/abort")
            status = response.json().get("status") if response.status_code == 200 else None
            self.answers[rid] = (response.status_code, status)


def expectation(answers: dict[str, tuple[int, str | None]]) -> Any:
    def expect(rid: str, finish: Finish) -> str | None:
        if finish.status is None:
            return f"its state expired ({RESULT_TTL_S}s TTL) before the watcher read it: the test process lagged"
        code, status = answers.get(rid, (0, None))
        if code == 200:
            want = "aborted"
        elif code in (0, 404, 409):  # not aborted, expired before the abort, finished before it
            want = "succeeded"
        else:
            return f"abort answered {code}"
        return None if finish.status == want else f"abort answer {code} {status}: ended {finish}, expected {want}"

    return expect


def test_soak_every_request_ends_once_and_nothing_leaks(
    chaos_redis: RedisFactory, chaos_fleet: FleetFactory, soak_count: int
) -> None:
    rng = random.Random(20240601)
    server = chaos_redis()
    fleet = chaos_fleet(
        server,
        workers=1,
        FUSEFLEET_RUNNER="bench.runners:NullRunner",
        FUSEFLEET_MAX_NUM_SEQS="64",
        FUSEFLEET_BATCH_ORDER="grouped",
        FUSEFLEET_RESULT_TTL_S=str(RESULT_TTL_S),
        FUSEFLEET_RESULT_SWEEP_INTERVAL_S="1",
        FUSEFLEET_MAX_QUEUE_LEN=str(max(100_000, soak_count)),
    )
    with FinishedWatcher(server.url, fleet.keys) as watcher:
        # warm-up (scripts loaded, broker bindings, connections), then the baseline once its results expired
        warm = submit_all(fleet, random_bodies(4 * CHUNK, rng, SHAPES))
        assert not watcher.wait_all(warm, 60), f"warm-up did not finish ({fleet.logs_hint()})"
        seen = leftover_keys(fleet)
        assert seen.get("req") and seen.get("result"), f"the key scan does not see request and image keys: {seen}"
        wait_no_leftovers(fleet, "the warm-up")
        baseline = memory(fleet)

        started = time.monotonic()
        aborter = Aborter(fleet, rng).start()
        ids: list[str] = []
        bodies = random_bodies(soak_count, rng, SHAPES)
        for i in range(0, soak_count, 4 * CHUNK):  # four chunks in flight at a time
            chunk_ids = submit_all(fleet, bodies[i : i + 4 * CHUNK])
            aborter.consider(chunk_ids)
            ids += chunk_ids
        submitted_s = time.monotonic() - started
        aborter.finish(timeout=60)
        answers = aborter.answers

        finishes = assert_every_request_ended_once(
            fleet, watcher, ids, timeout=60 + soak_count / 100, expect=expectation(answers)
        )
        ended_s = time.monotonic() - started
        peak = int(fleet.redis.info("memory")["used_memory_peak"])

    outcome = Counter(finishes[rid].status for rid in ids)
    codes = Counter(code for code, _ in answers.values())
    assert outcome["aborted"] >= 1 and codes[200] >= 1, (outcome, codes)

    wait_no_leftovers(fleet, "the soak")
    assert fleet.redis.xlen(fleet.keys.requests) == 0
    assert fleet.redis.llen(f"{fleet.prefix}:{fleet.env['FUSEFLEET_QUEUE_NAME']}") == 0  # broker_key_prefix
    settled: list[int] = []

    def back_to_baseline() -> bool:
        settled.append(memory(fleet))
        return settled[-1] <= baseline + MEMORY_SLACK

    try:
        wait_for(back_to_baseline, 30, "used_memory to return to its baseline", interval=0.5)
    except TimeoutError:
        raise AssertionError(
            f"used_memory stays {settled[-1] - baseline} bytes above its baseline ({baseline}); "
            f"keys now: {sorted(fleet.redis.scan_iter(count=1000))[:30]}"
        ) from None
    print(
        f"soak: {soak_count} requests submitted in {submitted_s:.1f}s, all ended in {ended_s:.1f}s; {dict(outcome)}; "
        f"abort answers {dict(codes)}; memory baseline {baseline}, peak {peak}, after {settled[-1]} "
        f"({settled[-1] - baseline:+d} bytes)"
    )
