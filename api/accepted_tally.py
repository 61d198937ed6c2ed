"""An api process's count of accepted requests on its way to the fleet's metrics (``fusefleet_requests_accepted``).

The fleet's count is the metrics hash's ``accepted`` field (shared/metrics.py). ``submit.lua`` adds to it what the
api tells it to (its ARGV ``count``), not one ``HINCRBY`` per call: a submission counts its own requests and those
this process accepted before it that still wait when the last write is ``every_s`` old (one ``HINCRBY`` a second in
a script that runs anyway), else it adds nothing and its requests wait, and a timer writes what waits once the
interval is over (one plain ``HINCRBY``). So the count lags by at most ``every_s``; ``close`` writes what waits
(the api's shutdown), and a process killed loses at most that long's count. A write that fails (the submission's
own script or the timer's) puts its count back to wait for the next one: a reply lost after the write counted
them would count them twice, the rarer error.

Contract: ``take(n)`` before a submission's script (what it adds when it accepts), then exactly one of
``accepted(n, taken)``, ``refused(n, taken)`` or ``failed(n, taken)`` after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)
EVERY_S = 1.0
"""At most one write of a process's accepted count this often (the fleet's count lags by at most this)."""


class AcceptedTally:
    """What this process accepted and has not yet written (``waiting``), and when it last wrote."""

    def __init__(self, write: Callable[[int], Awaitable[object]], every_s: float = EVERY_S) -> None:
        """``write(count)`` adds ``count`` to the fleet's count (one ``HINCRBY``), raising when it could not."""
        self._write = write
        self._every_s = every_s
        self.waiting = 0
        self._written_at = float("-inf")  # the event loop's clock
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: asyncio.Task[None] | None = None

    def take(self, requests: int) -> int:
        """How many a submission of ``requests`` requests counts when it is accepted: those and the waiting ones
        when a write is due (they are then no longer waiting), else 0."""
        now = asyncio.get_running_loop().time()
        if now - self._written_at < self._every_s:
            return 0
        taken, self.waiting, self._written_at = requests + self.waiting, 0, now
        return taken

    def accepted(self, requests: int, taken: int) -> None:
        """The submission was accepted: its script counted ``taken``; when that was 0, its requests wait."""
        if not taken:
            self._wait(requests)

    def refused(self, requests: int, taken: int) -> None:
        """The submission was refused: nothing counted, its own requests are not to be counted, the others wait."""
        self._wait(taken - requests if taken else 0)

    def failed(self, requests: int, taken: int) -> None:
        """The submission's outcome is unknown (Redis failed): the waiting ones it took wait again (its own requests
        count only if it was accepted, which no one can tell now)."""
        self.refused(requests, taken)

    def _wait(self, count: int) -> None:
        if count > 0:
            self.waiting += count
            self._schedule()

    def _flush_soon(self) -> None:
        self._timer = None
        self._flushing = asyncio.get_running_loop().create_task(self._flush(), name="fusefleet-accepted-tally")

    async def _flush(self) -> None:
        count, self.waiting = self.waiting, 0
        self._written_at = asyncio.get_running_loop().time()
        try:
            if count:
                await self._write(count)
        except Exception as exc:  # noqa: BLE001 - a metric: it waits for the next write, never fails a request
            log.warning("accepted count not written (%d requests; retried): %s", count, exc)
            self.waiting += count
        finally:
            self._flushing = None
            if self.waiting:
                self._schedule()

    def _schedule(self) -> None:
        """A write of what waits once the interval since the last is over (unless one is set or under way)."""
        if self._timer is None and self._flushing is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(max(0.0, self._written_at + self._every_s - loop.time()), self._flush_soon)

    async def close(self) -> None:
        """Write what waits now (once, errors logged), and stop the timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flushing is not None:
            with contextlib.suppress(Exception):
                await self._flushing
        if self.waiting:
            count, self.waiting = self.waiting, 0
            try:
                await self._write(count)
            except Exception as exc:  # noqa: BLE001 - shutting down: logged, not raised
                log.warning("accepted count not written at shutdown (%d requests): %s", count, exc)
