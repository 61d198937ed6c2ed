"""``scheduler.lease``: the lease on fakeredis, and ``LeaderLoop`` (stand by, lead, step down) around scripted leads."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import fakeredis
import pytest

from scheduler.lease import OUTAGE_BACKOFF_CAP_S, LeaderLoop, Lease

KEY = "t:lease"


@pytest.fixture()
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(decode_responses=True)


def test_one_contender_holds_the_lease_until_it_releases_it(client: fakeredis.FakeRedis) -> None:
    first, second = Lease(client, KEY, 5000), Lease(client, KEY, 5000)
    assert first.try_acquire() and first.try_acquire()  # taken, then kept
    assert not second.try_acquire() and not second.renew()
    second.release()  # not its own: nothing happens
    assert client.get(KEY) == first.token
    first.release()
    assert second.try_acquire()
    assert not first.renew()
    assert first.renew_every_s == pytest.approx(5 / 3)


class Waits(threading.Event):
    """A stop event whose waits are recorded and return at once; set after ``rounds`` waits."""

    def __init__(self, rounds: int) -> None:
        super().__init__()
        self.rounds = rounds
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(float(timeout or 0))
        if len(self.waits) >= self.rounds:
            self.set()
        return self.is_set()


def test_a_standby_tries_again_every_third_of_the_ttl(client: fakeredis.FakeRedis) -> None:
    other = Lease(client, KEY, 3000)
    assert other.try_acquire()
    standbys: list[int] = []
    led: list[str] = []
    stop = Waits(rounds=3)
    loop = LeaderLoop(
        Lease(client, KEY, 3000), lambda _: led.append("led"), name="test", standby=lambda: standbys.append(1)
    )
    loop.run(stop)
    assert led == [] and stop.waits == [1.0, 1.0, 1.0] and len(standbys) == 3
    assert client.get(KEY) == other.token  # not ours to release


def test_a_lead_renews_and_returns_when_the_lease_is_lost_then_the_loop_leads_again(
    client: fakeredis.FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="scheduler.lease")
    now = [0.0]
    lease = Lease(client, KEY, 3000)
    stop = threading.Event()
    terms: list[list[bool]] = []

    def lead(_: threading.Event) -> None:
        renewal = loop.renewal()
        renewals: list[bool] = []
        terms.append(renewals)
        assert not renewal.due(now[0]) and renewal.until_due_s(now[0]) == pytest.approx(1.0)
        now[0] += 1.0
        assert renewal.due(now[0])
        renewals.append(renewal.renew(now[0]))  # ours: renewed
        assert renewal.until_due_s(now[0]) == pytest.approx(1.0)
        client.set(KEY, "someone else")  # taken over
        renewals.append(renewal.renew(now[0]))
        if len(terms) == 2:
            stop.set()
        else:
            client.delete(KEY)  # it lapses: the loop leads again

    loop = LeaderLoop(lease, lead, name="test", clock=lambda: now[0])
    loop.run(stop)
    assert terms == [[True, False], [True, False]]
    assert [r.message for r in caplog.records].count("test lease lost; standing by") == 2
    assert sum("test" in r.message and "is active" in r.message for r in caplog.records) == 2
    assert client.get(KEY) == "someone else"  # released only if ours


Lead = Callable[[threading.Event], None]


def failing(errors: list[Exception], clock: list[float], led_s: float = 0.0) -> Lead:
    def lead(_: threading.Event) -> None:
        clock[0] += led_s
        raise errors.pop(0)

    return lead


def test_a_failing_round_backs_off_doubling_up_to_the_cap_and_releases_the_lease_at_the_end(
    client: fakeredis.FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    errors: list[Exception] = [ConnectionError("refused")] * 3 + [ValueError("a bug")] * 6
    stop = Waits(rounds=len(errors))
    lease = Lease(client, KEY, 3000)
    LeaderLoop(lease, failing(errors, [0.0]), name="test").run(stop)
    assert stop.waits == [
        0.1,
        0.2,
        0.4,
        0.8,
        1.6,
        3.2,
        OUTAGE_BACKOFF_CAP_S,
        OUTAGE_BACKOFF_CAP_S,
        OUTAGE_BACKOFF_CAP_S,
    ]
    messages = [r.message for r in caplog.records]
    assert "test: Redis unavailable (ConnectionError: refused); standing by 0.1 s" in messages
    assert "test round failed; standing by 0.8 s" in messages
    assert not client.exists(KEY)  # released on the way out


@pytest.mark.parametrize("healthy_lead_s, expected", [(10.0, [0.1, 0.1, 0.1]), (None, [0.1, 0.2, 0.4])])
def test_a_lead_that_lasted_resets_the_backoff_only_with_healthy_lead_s(
    client: fakeredis.FakeRedis, healthy_lead_s: float | None, expected: list[float]
) -> None:
    clock = [0.0]
    stop = Waits(rounds=3)
    lead = failing([ValueError("late")] * 3, clock, led_s=11.0)  # each fails after 11 s of leading
    loop = LeaderLoop(
        Lease(client, KEY, 3000), lead, name="test", clock=lambda: clock[0], healthy_lead_s=healthy_lead_s
    )
    loop.run(stop)
    assert stop.waits == expected


def test_a_round_that_ends_well_resets_the_backoff(client: fakeredis.FakeRedis) -> None:
    outcomes: list[Exception | None] = [ValueError("1"), ValueError("2"), None, ValueError("3")]
    stop = Waits(rounds=4)

    def lead(_: threading.Event) -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        stop.wait(0.0)  # a lead that returned (its lease lost): the loop goes on

    LeaderLoop(Lease(client, KEY, 3000), lead, name="test").run(stop)
    assert stop.waits == [0.1, 0.2, 0.0, 0.1]


def test_a_release_that_fails_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(Lease):
        def try_acquire(self) -> bool:
            raise ConnectionError("refused")

        def release(self) -> None:
            raise ConnectionError("still refused")

    stop = Waits(rounds=1)
    started = time.monotonic()
    LeaderLoop(Broken(fakeredis.FakeRedis(), KEY, 3000), lambda _: None, name="test").run(stop)
    assert time.monotonic() - started < 1.0
    assert "could not release the test lease: still refused" in [r.message for r in caplog.records]
