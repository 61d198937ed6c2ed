"""``api.coalescer.Coalescer``: a call alone goes at once; calls arriving while a flush is in flight go together in
the next; a flush's failure is each of its calls'; a call cancelled while it waits is never flushed."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from api.coalescer import Coalescer

pytestmark = pytest.mark.anyio


class Recorder:
    """A flush that records each batch it gets and returns the items doubled; it waits for ``gate`` when set."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate: asyncio.Event | None = None
        self.failure: BaseException | None = None

    async def __call__(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        if self.gate is not None:
            await self.gate.wait()
        if self.failure is not None:
            raise self.failure
        return [item * 2 for item in items]


def gated(max_items: int = 8) -> tuple[Recorder, Coalescer[int, int]]:
    """A recorder whose flushes wait for its gate, and a coalescer over it."""
    flush = Recorder()
    flush.gate = asyncio.Event()
    return flush, Coalescer(flush, max_items=max_items)


async def flushing(coalescer: Coalescer[int, int], item: int) -> asyncio.Future[int]:
    """A call of ``item`` whose flush is under way (held at the recorder's gate)."""
    call = asyncio.ensure_future(coalescer(item))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return call


async def test_a_call_alone_is_flushed_at_once_and_gets_its_own_result() -> None:
    flush = Recorder()
    coalescer = Coalescer(flush, max_items=8)
    assert await coalescer(3) == 6
    assert await coalescer(4) == 8
    assert flush.batches == [[3], [4]]


async def test_calls_arriving_while_a_flush_is_in_flight_go_together_in_the_next() -> None:
    flush, coalescer = gated(max_items=3)
    first = await flushing(coalescer, 1)
    later = [asyncio.ensure_future(coalescer(item)) for item in (2, 3, 4, 5)]
    await asyncio.sleep(0)
    assert flush.batches == [[1]]
    flush.gate.set()
    assert await first == 2
    assert await asyncio.gather(*later) == [4, 6, 8, 10]
    assert flush.batches == [[1], [2, 3, 4], [5]]  # at most max_items a flush, in arrival order
    assert coalescer.flushes == 3


async def test_calls_of_one_tick_share_the_first_flush() -> None:
    flush = Recorder()
    coalescer = Coalescer(flush, max_items=8)
    assert await asyncio.gather(*(coalescer(item) for item in range(5))) == [0, 2, 4, 6, 8]
    assert flush.batches == [[0, 1, 2, 3, 4]]


async def test_a_call_heavier_than_the_weight_bound_goes_alone_and_lighter_ones_share() -> None:
    flush = Recorder()
    coalescer = Coalescer(flush, max_items=8, weight=lambda item: item, max_weight=10)
    assert await asyncio.gather(*(coalescer(item) for item in (4, 5, 2, 30, 1))) == [8, 10, 4, 60, 2]
    assert flush.batches == [[4, 5], [2], [30], [1]]  # 4 + 5 fit, + 2 would not; 30 alone; 1 after it


async def test_a_failed_flush_fails_each_of_its_calls_and_the_next_flush_still_runs() -> None:
    flush, coalescer = gated()
    first = await flushing(coalescer, 1)
    second, third = asyncio.ensure_future(coalescer(2)), asyncio.ensure_future(coalescer(3))
    await asyncio.sleep(0)
    flush.failure = ConnectionError("down")
    flush.gate.set()
    for call in (first, second, third):
        with pytest.raises(ConnectionError, match="down"):
            await call
    flush.failure = None
    assert await coalescer(4) == 8  # nothing stuck: a later call is flushed


async def test_a_call_cancelled_while_waiting_is_never_flushed_and_one_in_flight_still_is() -> None:
    flush, coalescer = gated()
    in_flight = await flushing(coalescer, 1)
    waiting, kept = asyncio.ensure_future(coalescer(2)), asyncio.ensure_future(coalescer(3))
    await asyncio.sleep(0)
    waiting.cancel()
    in_flight.cancel()  # its flush is under way: it is flushed, only its caller stops waiting
    flush.gate.set()
    assert await kept == 6
    assert flush.batches == [[1], [3]]
    assert waiting.cancelled() and in_flight.cancelled()


async def test_a_flush_returning_the_wrong_number_of_results_fails_its_calls() -> None:
    async def short(items: Sequence[int]) -> list[int]:
        return list(items)[:-1]

    coalescer = Coalescer(short, max_items=8)
    with pytest.raises(RuntimeError, match="2 items returned 1"):
        await asyncio.gather(coalescer(1), coalescer(2))


def test_max_items_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_items"):
        Coalescer(Recorder(), max_items=0)


async def test_a_flush_cancelled_cancels_its_calls_and_those_waiting() -> None:
    flush, coalescer = gated()
    in_flight = await flushing(coalescer, 1)
    waiting = asyncio.ensure_future(coalescer(2))
    await asyncio.sleep(0)
    assert coalescer._flushing is not None
    coalescer._flushing.cancel()
    for call in (in_flight, waiting):
        with pytest.raises(asyncio.CancelledError):
            await call
    assert flush.batches == [[1]]
    flush.gate.set()
    assert await coalescer(3) == 6  # a later call starts a flush of its own
