"""The api's completion subscription killed (``CLIENT KILL TYPE pubsub``) under many long polls.

One worker runs batches of up to 8 (``IMAGE_S`` an image), so requests end all through the fault. Long polls
(``GET /v1/requests/{id}?wait_s=WAIT_S``, a client thread each) are in flight on requests already running and not
noted by the waiter (a first kill dropped the notes: their polls read them, then wait), on requests accepted just
before the kill (noted: their first read is skipped), on requests accepted while the api had not yet subscribed
again, and on requests accepted after it had. The api is held (SIGSTOP) from the kill until the running batch has
ended, so that batch surely ends while nothing listens on ``P:finished``: its publication is lost, and only the
waiter's wake-up at its new subscription makes those polls read again.

Asserted: every request succeeds; every long poll answers its request's terminal state within ``bound_s`` of the
request's end (or of the api's resumption, for the batch that ended while it was held): each loss costs at most
``RECONNECT_DELAY_S`` before the subscription is back, then one read, not ``WAIT_S``; no long poll answers a
non-terminal state before ``WAIT_S`` (the contract: terminal, or at ``wait_s``); the services live and serve a new
request. Variants (after the first kill that drops the notes): one kill; two kills, the second as soon as the server
has the api subscribed again (maybe before the api read the confirmation). The worst latency is printed.
"""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

import httpx
import pytest

from api.waiter import RECONNECT_DELAY_S
from tests.chaos.conftest import FleetFactory, RedisFactory
from tests.support.chaos import body, dead_services, serves_a_new_request, statuses
from tests.support.fleet import TERMINAL, Fleet
from tests.support.processes import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]

IMAGE_S = 0.25  # a batch takes this per image (FUSEFLEET_SIM_PER_IMAGE_MS): 2 s for a full one of 8
RUNNING_STEPS = 20  # the running batch's steps: 0.1 s each, so its last steps can be waited for
WAIT_S = 20.0  # each long poll's wait_s: far above the bound, so a missed wake-up cannot pass for a slow one
POLLS_PER_REQUEST = 2
SLACK_S = 2.0  # a subscribe, one HMGET and the HTTP answer on a loaded 2-core VM


def bound_s(kills: int) -> float:
    """The latest a long poll may answer after its request ended: each kill costs one resubscription delay."""
    return kills * RECONNECT_DELAY_S + SLACK_S


@dataclass(frozen=True)
class Answer:
    """One ``GET ?wait_s=`` of a long poll: when it was sent and answered (wall clock) and what it said."""

    sent: float
    answered: float
    status: str
    finished_at: float | None


class LongPolls:
    """Threads that each long-poll a request until it answers a terminal state (or ``deadline_s`` passes)."""

    def __init__(self, base_url: str, deadline_s: float = 60.0) -> None:
        self._client = httpx.Client(
            base_url=base_url,
            timeout=WAIT_S + 15,
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=200),
        )
        self._pool = ThreadPoolExecutor(max_workers=128, thread_name_prefix="long-poll")
        self._deadline = time.monotonic() + deadline_s
        self._polls: dict[str, Future[list[Answer]]] = {}
        self.kinds: dict[str, str] = {}
        self._lock = threading.Lock()

    def start(self, kind: str, ids: list[str]) -> None:
        """``POLLS_PER_REQUEST`` long polls on each of ``ids``, labelled ``<id>/<n>``."""
        for rid in ids:
            for n in range(POLLS_PER_REQUEST):
                with self._lock:
                    self.kinds[f"{rid}/{n}"] = kind
                    self._polls[f"{rid}/{n}"] = self._pool.submit(self._poll, rid)

    def _poll(self, rid: str) -> list[Answer]:
        answers: list[Answer] = []
        while time.monotonic() < self._deadline:
            sent = time.time()
            response = self._client.get(f"/v1/requests/{rid}", params={"wait_s": WAIT_S})
            answered = time.time()
            assert response.status_code == 200, f"{rid}: {response.status_code} {response.text}"
            state = response.json()
            finished = state.get("finished_at")
            finished_at = datetime.fromisoformat(finished).timestamp() if finished else None
            answers.append(Answer(sent, answered, state["status"], finished_at))
            if state["status"] in TERMINAL:
                break
        return answers

    def results(self, timeout: float) -> dict[str, list[Answer]]:
        """Every poll's answers, by label."""
        with self._lock:
            polls = dict(self._polls)
        return {label: poll.result(timeout=timeout) for label, poll in polls.items()}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()


def subscribers(fleet: Fleet) -> int:
    """How many connections are subscribed to the fleet's ``P:finished`` (the api's, once subscribed)."""
    ((_, count),) = fleet.redis.pubsub_numsub(fleet.keys.finished)
    return int(count)


def kill_pubsub(fleet: Fleet) -> float:
    """``CLIENT KILL TYPE pubsub``: every subscriber of the test Redis (the api's, Celery's remote control); when."""
    assert subscribers(fleet) == 1, "the api should be the only subscriber of P:finished"
    killed_at = time.time()
    assert int(fleet.redis.client_kill_filter(_type="pubsub")) >= 1
    return killed_at


def resubscribed(fleet: Fleet) -> float:
    """Wait until the server has the api subscribed again; when."""
    wait_for(lambda: subscribers(fleet) == 1, 15, "the api to subscribe again", interval=0.01)
    return time.time()


def running_step(fleet: Fleet, rid: str) -> int:
    return int(fleet.get(rid)["progress"]["step"])


def scenario(fleet: Fleet, kills: int) -> str:
    """Long polls through ``kills`` kills in a row (each further one as soon as the api subscribed again); asserts
    the bounds and returns the summary line."""
    polls = LongPolls(fleet.base_url)
    try:
        running = fleet.submit_batch([body(f"running {i}", steps=RUNNING_STEPS) for i in range(8)])
        fleet.wait_running(running[0], min_step=1)
        # a first kill drops the waiter's notes: the running requests are not noted (as if another api had accepted
        # them), so their polls read them first, find them running and wait on the channel alone
        kill_pubsub(fleet)
        resubscribed(fleet)
        time.sleep(0.2)  # the api has seen its new subscription confirmed: "before" is noted
        before = fleet.submit_batch([body(f"before {i}") for i in range(8)])
        polls.start("running", running)
        polls.start("before", before)
        wait_for(lambda: running_step(fleet, running[0]) >= RUNNING_STEPS - 3, 30, "the running batch's last steps")
        # the api held (SIGSTOP) from the kill until the running batch ended, so that batch surely ends while
        # nothing listens: its publication is lost, whichever way redis-py then reconnects (at once, or after the
        # listener's RECONNECT_DELAY_S)
        fleet.api.signal(signal.SIGSTOP)
        try:
            killed_at = kill_pubsub(fleet)
            wait_for(lambda: statuses(fleet, running) == {"succeeded": len(running)}, 15, "the running batch's end")
        finally:
            fleet.api.signal(signal.SIGCONT)
        resumed_at = time.time()
        # accepted while the api sees its subscription lost or not yet confirmed again: not noted, read first
        polls.start("during", fleet.submit_batch([body(f"during {i}", steps=6) for i in range(4)]))
        gaps = [(killed_at, resubscribed(fleet))]
        for _ in range(kills - 1):  # at once: the api may not even have seen the confirmation
            killed_at = kill_pubsub(fleet)
            gaps.append((killed_at, resubscribed(fleet)))
        time.sleep(0.2)  # the api has seen its new subscription confirmed: these are noted
        polls.start("after", fleet.submit_batch([body(f"after {i}", steps=8) for i in range(4)]))
        results = polls.results(timeout=90)
    finally:
        polls.close()

    bound = bound_s(len(gaps))
    latencies: dict[str, float] = {}
    for label, answers in results.items():
        assert answers, f"{label} ({polls.kinds[label]}) was never answered"
        for answer in answers[:-1]:  # a non-terminal answer only at wait_s
            held = answer.answered - answer.sent
            assert held >= WAIT_S, f"{label} answered {answer.status} after {held:.2f}s, before wait_s={WAIT_S}"
        last = answers[-1]
        assert last.status == "succeeded", f"{label} ({polls.kinds[label]}) ended {last.status}"
        assert last.finished_at is not None
        latencies[label] = last.answered - max(last.finished_at, last.sent, resumed_at)
    late = {f"{label} ({polls.kinds[label]})": round(s, 2) for label, s in latencies.items() if s > bound}
    assert not late, f"long polls answered later than {bound:.1f}s after their request ended: {late}"
    in_gap = {
        label.split("/")[0]
        for label, answers in results.items()
        if any(start <= (answers[-1].finished_at or 0) <= end for start, end in gaps)
    }
    assert in_gap, f"no request ended while the api was unsubscribed ({gaps}): the test proved nothing"

    assert not dead_services(fleet), f"service processes died: {dead_services(fleet)}"
    state = serves_a_new_request(fleet)
    assert state["status"] == "succeeded", f"a new request after the kill ended {state}"

    worst = max(latencies, key=latencies.__getitem__)
    by_kind = {
        kind: max(s for label, s in latencies.items() if polls.kinds[label] == kind)
        for kind in ("running", "before", "during", "after")
    }
    unsubscribed = ", ".join(f"{end - start:.2f}s" for start, end in gaps)  # the first one includes the hold
    return (
        f"{len(results)} long polls, unsubscribed {unsubscribed}, {len(in_gap)} requests ended meanwhile; "
        f"worst latency {latencies[worst]:.2f}s ({polls.kinds[worst]}; bound {bound:.1f}s); worst by kind "
        + ", ".join(f"{kind} {s:.2f}s" for kind, s in by_kind.items())
    )


def fleet_of(chaos_redis: RedisFactory, chaos_fleet: FleetFactory) -> Fleet:
    fleet = chaos_fleet(
        chaos_redis(),
        FUSEFLEET_SIM_BASE_MS="0",
        FUSEFLEET_SIM_PER_IMAGE_MS=str(int(IMAGE_S * 1000)),
        FUSEFLEET_MAX_NUM_SEQS="8",
    )
    if fleet.env.get("FUSEFLEET_REDIS_CLUSTER") == "true":
        pytest.skip("the fleet's state is on the Redis Cluster: CLIENT KILL on the broker would miss the api")
    return fleet


def test_long_polls_through_a_killed_pubsub_connection(chaos_redis: RedisFactory, chaos_fleet: FleetFactory) -> None:
    started = time.monotonic()
    fleet = fleet_of(chaos_redis, chaos_fleet)
    summary = scenario(fleet, kills=1)
    print(f"pubsub killed once: {summary}; took {time.monotonic() - started:.1f}s")


def test_long_polls_through_two_kills_in_quick_succession(chaos_redis: RedisFactory, chaos_fleet: FleetFactory) -> None:
    """The second kill as soon as the server has the api subscribed again (maybe before the api saw it confirmed)."""
    started = time.monotonic()
    fleet = fleet_of(chaos_redis, chaos_fleet)
    summary = scenario(fleet, kills=2)
    print(f"pubsub killed twice: {summary}; took {time.monotonic() - started:.1f}s")
