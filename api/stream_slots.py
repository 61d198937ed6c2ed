"""Event-stream slots of one api process: at most ``total`` streams at once, at most ``per_holder`` of one holder.

A holder is who opens the stream: its API key, or (an api without keys) its client address. ``StreamSlots.take``
checks and counts in one step under a lock, so concurrent opens never exceed either cap; the ``Slot`` it gives is
released once, however the stream ends (``api.routes.events`` takes it when the response starts and releases it
when the response is done: the last event sent, the client gone, an error or a cancellation; a response that never
starts takes none). A refused open names the cap it hit (``SlotsRefused``).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Literal

SlotLimit = Literal["max_event_streams", "max_event_streams_per_key"]


@dataclass(frozen=True, slots=True)
class SlotsRefused(Exception):
    """No slot for ``holder``: ``limit`` (the setting, of value ``cap``) streams are open already."""

    holder: str
    limit: SlotLimit
    cap: int


class Slot:
    """One open stream of ``holder``; ``release`` gives it back (once: later calls do nothing)."""

    def __init__(self, slots: StreamSlots, holder: str) -> None:
        self._slots = slots
        self.holder = holder
        self._released = False

    def release(self) -> None:
        with self._slots._lock:
            if self._released:
                return
            self._released = True
            self._slots._drop(self.holder)


class StreamSlots:
    """The open event streams of a process, counted per holder (``total`` and ``per_holder`` at least 1)."""

    def __init__(self, total: int, per_holder: int) -> None:
        self.total = total
        self.per_holder = per_holder
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()
        self._open = 0

    @property
    def open(self) -> int:
        """Streams open now."""
        return self._open

    def held(self, holder: str) -> int:
        """Streams ``holder`` has open now."""
        return self._held[holder]

    def take(self, holder: str) -> Slot:
        """A slot for ``holder``, counted at once; ``SlotsRefused`` when the process or ``holder`` is at its cap
        (the process's cap first: it says the server, not the holder, is busy)."""
        with self._lock:
            if self._open >= self.total:
                raise SlotsRefused(holder, "max_event_streams", self.total)
            if self._held[holder] >= self.per_holder:
                raise SlotsRefused(holder, "max_event_streams_per_key", self.per_holder)
            self._open += 1
            self._held[holder] += 1
        return Slot(self, holder)

    def _drop(self, holder: str) -> None:
        """One stream of ``holder`` ended (under the lock)."""
        self._open -= 1
        self._held[holder] -= 1
        if not self._held[holder]:
            del self._held[holder]
