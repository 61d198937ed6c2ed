"""Which of the models a worker serves are loaded now: at most ``max_resident_models`` at once, least recently used
evicted first, a model loaded on demand when a batch of it comes (docs/models.md#residency).

Contract:

- ``Residency.acquire(model)`` hands back what runs ``model``'s batches (loading it first when it is not resident),
  pinned until ``release(model)``: a model with a batch running is never evicted. When room is needed and every
  resident model is pinned or was loaded less than ``min_residency_s`` ago, it raises ``NotNow`` (nothing loaded
  or evicted): the worker then hands the batch back uncounted and the scheduler places it again.
- Models that share components count once: each model has a footprint (``share``: by default its source, so two
  names of one pipeline load it once and hold one loaded copy); ``max_resident`` bounds footprints, not names.
- ``announce()`` says, per model, whether it is resident, the seconds its last load took and a moving average of
  its batches' seconds: the worker's heartbeat carries them (``ModelCapabilities``) to the scheduler's placement
  (``scheduler.placement``) and to ``fusefleet status`` and ``GET /v1/models``.

The choice of what to evict is the pure ``evictions``; ``Residency`` is thread-safe (the task thread loads, the
heartbeat thread reads ``announce``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

BATCH_S_WEIGHT = 0.3
"""Weight of the latest batch in a model's moving average of batch seconds."""


class NotNow(Exception):
    """No room for a model yet: every resident footprint has a batch running or is within its minimum residency.
    ``retry_after_s`` says when the first of them may be evicted (0 when only pins hold them)."""

    def __init__(self, model: str, retry_after_s: float) -> None:
        super().__init__(f"no room to load {model} yet (retry in {retry_after_s:.1f} s)")
        self.model = model
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class Footprint:
    """One loaded footprint as the eviction choice sees it: when it was loaded and last used (monotonic seconds)
    and how many batches hold it now."""

    loaded_at: float
    used_at: float
    pins: int = 0


def evictions(
    resident: Mapping[str, Footprint], need: str, limit: int, now: float, min_residency_s: float
) -> list[str] | None:
    """The footprints to evict, least recently used first, so that ``need`` fits among at most ``limit`` resident
    ones: [] when it is resident or fits; None when it cannot fit now (too few footprints are unpinned and past
    their minimum residency)."""
    if need in resident:
        return []
    excess = len(resident) + 1 - limit
    if excess <= 0:
        return []
    evictable = sorted(
        (key for key, foot in resident.items() if foot.pins == 0 and now - foot.loaded_at >= min_residency_s),
        key=lambda key: (resident[key].used_at, key),
    )
    return evictable[:excess] if len(evictable) >= excess else None


def retry_after(resident: Mapping[str, Footprint], now: float, min_residency_s: float) -> float:
    """When the first unpinned footprint passes its minimum residency (0 when none is left to wait for)."""
    waits = [foot.loaded_at + min_residency_s - now for foot in resident.values() if foot.pins == 0]
    return max(0.0, min(waits)) if waits else 0.0


@dataclass(frozen=True, slots=True)
class ModelState:
    """What a worker announces of one model it serves."""

    resident: bool
    load_s: float | None
    batch_s: float | None


@dataclass
class _Held(Generic[T]):
    value: T
    foot: Footprint
    load_s: float


class Residency(Generic[T]):
    """The loaded footprints of one worker process, LRU-bounded (module docstring)."""

    def __init__(
        self,
        models: Sequence[str],
        load: Callable[[str], T],
        unload: Callable[[str], None],
        *,
        max_resident: int | None,
        min_residency_s: float,
        share: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_load: Callable[[str, float], None] | None = None,
        on_evict: Callable[[str], None] | None = None,
    ) -> None:
        if not models:
            raise ValueError("a worker serves at least one model")
        self.models = tuple(models)
        self._share = {model: (share or {}).get(model, model) for model in models}
        self._limit = max_resident or len(set(self._share.values()))
        self._min_residency_s = min_residency_s
        self._load, self._unload = load, unload
        self._clock = clock
        self._on_load, self._on_evict = on_load, on_evict
        self._held: dict[str, _Held[T]] = {}  # footprint -> what it loaded
        self._load_s: dict[str, float] = {}  # footprint -> seconds its last load took
        self._batch_s: dict[str, float] = {}  # model -> moving average of its batches' seconds
        self._lock = threading.RLock()

    @property
    def limit(self) -> int:
        """Footprints held at most at once."""
        return self._limit

    def resident(self, model: str) -> bool:
        with self._lock:
            return self._share[model] in self._held

    def acquire(self, model: str) -> T:
        """What runs ``model``'s batches, loaded first if need be (evicting the least recently used footprints),
        pinned until ``release``. ``NotNow`` when there is no room yet; KeyError for a model not served."""
        key = self._share[model]
        with self._lock:
            now = self._clock()
            held = self._held.get(key)
            if held is None:
                feet = {k: h.foot for k, h in self._held.items()}
                victims = evictions(feet, key, self._limit, now, self._min_residency_s)
                if victims is None:
                    raise NotNow(model, retry_after(feet, now, self._min_residency_s))
                for victim in victims:
                    self._evict(victim)
                held = self._load_footprint(model, key)
            held.foot = Footprint(held.foot.loaded_at, self._clock(), held.foot.pins + 1)
            return held.value

    def release(self, model: str, batch_s: float | None = None) -> None:
        """A batch of ``model`` is over (``batch_s``: its seconds, for the moving average): unpin it."""
        key = self._share[model]
        with self._lock:
            held = self._held.get(key)
            if held is not None:
                held.foot = Footprint(held.foot.loaded_at, self._clock(), max(0, held.foot.pins - 1))
            if batch_s is not None:
                last = self._batch_s.get(model)
                self._batch_s[model] = batch_s if last is None else last + BATCH_S_WEIGHT * (batch_s - last)

    def warm(self) -> None:
        """Load each model once, in order, keeping the last ``limit`` footprints: the worker learns every model's
        traits (its ``load`` records them) and load time before it announces itself."""
        for model in self.models:
            key = self._share[model]
            with self._lock:
                if key not in self._held:
                    while len(self._held) >= self._limit:
                        self._evict(min(self._held, key=lambda k: self._held[k].foot.used_at))
                    self._load_footprint(model, key)

    def announce(self) -> dict[str, ModelState]:
        """Each model's state, as the heartbeat announces it."""
        with self._lock:
            return {
                model: ModelState(key in self._held, self._load_s.get(key), self._batch_s.get(model))
                for model, key in self._share.items()
            }

    def held(self) -> dict[str, T]:
        """Each resident model's loaded value, by model name."""
        with self._lock:
            return {model: self._held[key].value for model, key in self._share.items() if key in self._held}

    def _load_footprint(self, model: str, key: str) -> _Held[T]:
        log.info("loading %s", model)
        started = self._clock()
        value = self._load(model)
        seconds = max(0.0, self._clock() - started)
        now = self._clock()
        held = self._held[key] = _Held(value, Footprint(now, now), seconds)
        self._load_s[key] = seconds
        log.info("loaded %s in %.2f s (%d of %d resident)", model, seconds, len(self._held), self._limit)
        if self._on_load is not None:
            self._on_load(model, seconds)
        return held

    def _evict(self, key: str) -> None:
        held = self._held.pop(key)
        model = next(model for model, k in self._share.items() if k == key)
        log.info("evicting %s (least recently used; loaded %.1f s ago)", model, self._clock() - held.foot.loaded_at)
        del held
        self._unload(model)
        if self._on_evict is not None:
            self._on_evict(model)


def shared_footprints(sources: Mapping[str, str], models: Collection[str]) -> dict[str, str]:
    """Each model's footprint: models of one source share it (one loaded copy of that pipeline)."""
    return {model: sources[model] for model in models}
