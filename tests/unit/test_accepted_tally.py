"""The api's accepted count reaches the fleet's metrics in at most one write a second, none lost nor doubled:
counted in the submission's own script when a write is due, else by a timer once the interval is over."""

from __future__ import annotations

import asyncio

import pytest

from api.accepted_tally import AcceptedTally
from tests.support.api import Api

pytestmark = pytest.mark.anyio
EVERY_S = 0.2


class Written:
    """A tally's writes, failing while ``down``."""

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.down = False

    async def __call__(self, count: int) -> None:
        if self.down:
            raise ConnectionError("Redis is down")
        self.counts.append(count)


async def test_the_first_submission_counts_at_once_and_the_next_ones_within_the_interval_wait_for_one_write() -> None:
    written = Written()
    tally = AcceptedTally(written, every_s=EVERY_S)
    assert tally.take(2) == 2  # due: the submission's script counts them
    tally.accepted(2, 2)
    for n in (1, 3):
        taken = tally.take(n)
        assert taken == 0
        tally.accepted(n, taken)
    assert tally.waiting == 4 and written.counts == []
    await asyncio.sleep(EVERY_S * 2)
    assert written.counts == [4] and tally.waiting == 0  # one write for both, once the interval was over


async def test_a_refused_or_failed_submission_within_the_interval_leaves_nothing_of_its_own_waiting() -> None:
    written = Written()
    tally = AcceptedTally(written, every_s=EVERY_S)
    tally.accepted(1, tally.take(1))
    for settle in (tally.refused, tally.failed):
        taken = tally.take(5)
        assert taken == 0
        settle(5, taken)
    assert tally.waiting == 0
    await asyncio.sleep(EVERY_S * 2)
    assert written.counts == []  # nothing to write


async def test_what_a_due_submission_carried_waits_again_when_it_is_refused_or_fails_and_a_failed_write_retries() -> (
    None
):
    written = Written()
    tally = AcceptedTally(written, every_s=EVERY_S)
    tally.accepted(1, tally.take(1))
    tally.accepted(2, tally.take(2))  # waits: 2
    tally._written_at -= EVERY_S  # a write is due before the timer's
    for settle in (tally.refused, tally.failed):
        taken = tally.take(4)
        assert taken == 6  # the 2 waiting and its own 4
        settle(4, taken)
        assert tally.waiting == 2  # its own are not counted (refused, or no one can tell), the 2 wait again
        tally._written_at -= EVERY_S
    written.down = True
    await asyncio.sleep(EVERY_S * 1.5)  # the timer's write failed: they wait for the next
    assert tally.waiting == 2 and written.counts == []
    written.down = False
    await asyncio.sleep(EVERY_S * 1.5)
    assert written.counts == [2] and tally.waiting == 0


async def test_close_writes_what_waits() -> None:
    written = Written()
    tally = AcceptedTally(written, every_s=60.0)
    tally.accepted(1, tally.take(1))
    tally.accepted(3, tally.take(3))
    await tally.close()
    assert written.counts == [3] and tally.waiting == 0


async def test_the_api_counts_every_accepted_request_once_and_writes_the_rest_at_shutdown(api: Api) -> None:
    api.app.state.store.accepted_tally._every_s = 60.0  # no timer's write within the test
    for _ in range(5):
        response = await api.http.post("/v1/requests", json={"prompt": "a fox"})
        assert response.status_code == 202, response.text
    counted = int(await api.redis.hget(api.keys.metrics, "accepted") or 0)
    assert counted == 1  # the first at once (its script); the others wait for the interval's end
    await api.app.state.store.close()
    assert int(await api.redis.hget(api.keys.metrics, "accepted") or 0) == 5
