"""Riding out a Redis outage: bounded retries with capped exponential backoff.

Only errors that say "Redis is not reachable right now" are retried (connection refused or reset, timeouts,
a server still loading its append-only file after a restart); anything else is a bug or a refusal and is raised
at once. Every retry loop has a deadline, so no caller waits forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import redis.exceptions as rex
from kombu.exceptions import OperationalError

log = logging.getLogger(__name__)

T = TypeVar("T")

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    rex.ConnectionError,  # includes BusyLoadingError (a restarted server replaying its AOF)
    rex.TimeoutError,
    rex.TryAgainError,
    OperationalError,  # kombu's wrapper of a broker connection error (Celery publish)
    ConnectionError,
    TimeoutError,
)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` means Redis (or the broker on it) is unreachable for now, rather than a real failure."""
    return isinstance(exc, TRANSIENT_ERRORS)


@dataclass
class Backoff:
    """Delays 0.1, 0.2, 0.4 ... seconds, capped at ``cap_s``; ``reset()`` after a success."""

    initial_s: float = 0.1
    cap_s: float = 2.0
    _next_s: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self._next_s = self.initial_s

    def next(self) -> float:
        delay = self._next_s
        self._next_s = min(self.cap_s, self._next_s * 2)
        return delay

    def reset(self) -> None:
        self._next_s = self.initial_s


def call_with_retry(
    call: Callable[[], T],
    *,
    what: str,
    give_up_after_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``call()``, retried on transient Redis errors for at most ``give_up_after_s`` seconds; the last error is
    raised after that. ``call`` must be safe to repeat (every fusefleet script is: it checks state first)."""
    deadline = clock() + give_up_after_s
    backoff = Backoff()
    while True:
        try:
            return call()
        except TRANSIENT_ERRORS as exc:
            delay = backoff.next()
            if clock() + delay > deadline:
                raise
            log.warning("%s: Redis unavailable (%s: %s); retrying in %.1f s", what, type(exc).__name__, exc, delay)
            sleep(delay)


def repeat_until(
    stop: threading.Event, every_s: float, round_: Callable[[], object], *, what: str, backoff_cap_s: float
) -> None:
    """``round_()`` every ``every_s`` seconds until ``stop`` is set (the first one ``every_s`` from now): a loop that
    must outlive any outage. A round that raises is logged (a transient Redis error as a warning, anything else
    with its traceback) and tried again after a backoff (0.1 s doubling, at most ``backoff_cap_s``), which a round
    that ends well resets."""
    backoff = Backoff(cap_s=backoff_cap_s)
    delay = every_s
    while not stop.wait(delay):
        try:
            round_()
            backoff.reset()
            delay = every_s
        except Exception as exc:  # noqa: BLE001 - the loop must outlive any outage
            delay = backoff.next()
            if is_transient(exc):
                log.warning("%s: Redis unavailable (%s: %s); again in %.1f s", what, type(exc).__name__, exc, delay)
            else:
                log.exception("%s failed; again in %.1f s", what, delay)
