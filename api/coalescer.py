"""Group commit for one kind of Redis call: concurrent calls of an api process share one round trip.

While a flush is in flight, calls that arrive wait; when it returns, everything waiting goes in the next flush (up
to ``max_items``, and to ``max_weight`` by ``weight``: a call's bytes, say; a call over it goes alone). Alone, a
call goes at once (no timer, no added latency); under load, the calls of one round trip's time ride together, so
the api's round trips and script calls per request fall with its concurrency (the cost that bounds one Redis core's
requests/s: ``python -m bench redis``). ``RequestStore`` uses one for submissions (one ``submit.lua`` call of
several submissions, each accepted or refused on its own) and one for state reads (one pipeline of ``HMGET``s).

Contract of ``flush``: it gets the items in arrival order and returns one result per item, in that order; when it
raises, every call of that flush raises it (they shared the round trip, so they share its failure). A call cancelled
while it waits is taken out and never flushed; one cancelled after its flush began is flushed all the same (as a
call cancelled on the wire would be), and only its caller stops waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class Coalescer(Generic[Item, Result]):
    """One flush in flight at a time; the calls that arrive meanwhile go together in the next (at most ``max_items``,
    and ``max_weight`` of ``weight`` unless one call alone weighs more)."""

    def __init__(
        self,
        flush: Callable[[Sequence[Item]], Awaitable[Sequence[Result]]],
        max_items: int,
        weight: Callable[[Item], int] | None = None,
        max_weight: int = 0,
    ) -> None:
        if max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        self._flush = flush
        self._max_items = max_items
        self._weight = weight
        self._max_weight = max_weight
        self._waiting: list[tuple[Item, asyncio.Future[Result]]] = []
        self._flushing: asyncio.Task[None] | None = None
        self.flushes = 0  # flushes made (for tests and the curious)

    async def __call__(self, item: Item) -> Result:
        """``item``'s result from the flush it went in (or that flush's exception)."""
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieved)
        entry = (item, future)
        self._waiting.append(entry)
        if self._flushing is None:
            self._flushing = asyncio.create_task(self._drain())
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if entry in self._waiting:  # not flushed yet: it never will be
                self._waiting.remove(entry)
            raise

    async def _drain(self) -> None:
        try:
            while self._waiting:
                taken = self._taken()
                batch, self._waiting = self._waiting[:taken], self._waiting[taken:]
                self.flushes += 1
                try:
                    results = await self._flush([item for item, _ in batch])
                    if len(results) != len(batch):
                        raise RuntimeError(f"a flush of {len(batch)} items returned {len(results)} results")
                except Exception as exc:  # noqa: BLE001 - each call of the flush gets it
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                except BaseException:  # cancelled (the loop closing): so is every call still waiting
                    for _, future in batch + self._waiting:
                        future.cancel()
                    self._waiting = []
                    raise
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._flushing = None

    def _taken(self) -> int:
        """How many of the waiting calls the next flush takes (at least one)."""
        if self._weight is None:
            return min(self._max_items, len(self._waiting))
        taken, total = 0, 0
        for item, _ in self._waiting[: self._max_items]:
            total += self._weight(item)
            if taken and total > self._max_weight:
                break
            taken += 1
        return taken


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark a call's exception as seen: its caller may have stopped waiting (cancelled after its flush began)."""
    if not future.cancelled():
        future.exception()
