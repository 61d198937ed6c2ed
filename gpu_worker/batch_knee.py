"""Batch only where it pays: the largest batch that still gains throughput (the knee), from forward times.

``knee(seconds_by_size, margin)`` is the pure core: from the measured seconds of one forward by batch size (one
shape: a model's requests of one pixel cost, ``shared.compat.pixel_cost``; per denoising step, since a forward's
time is proportional to its steps), walking the sizes in increasing order from the smallest (the measured sizes
double: ``measured_sizes``), the last size before the first whose throughput (requests per second) falls short of
the size before it by more than ``margin``: each size taken gains at least ``margin`` (0.1: ten percent) over the
one before, and the first that gains less, which would add its latency for little, ends the walk. Where batching
pays nothing the knee is the smallest size (1); the scheduler caps the batches of that shape there, never above
``max_num_seqs`` (``scheduler.policy``). Noise is the moving average's to smooth (``KneeTable``).

``KneeTable`` holds the measurements of one model on one device: per shape, per batch size, the seconds per step
of its forwards (the start-up measurement, then a moving average of the live forwards, so the table follows the
device as it really runs), saved as JSON where the worker keeps its caches so a restart starts from them.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

LIVE_WEIGHT = 0.2
"""Weight of one live forward in a size's moving average (the last ten or so forwards carry most of it)."""


def knee(seconds_by_size: Mapping[int, float], margin: float) -> int | None:
    """The largest batch size up to which each size's throughput beats the one before it by ``margin`` (see the
    module); None without a measurement. Sizes below 1 and times that are not positive are ignored."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    sizes = sorted(size for size, seconds in seconds_by_size.items() if size >= 1 and seconds > 0)
    if not sizes:
        return None
    chosen = sizes[0]
    best = chosen / seconds_by_size[chosen]
    for size in sizes[1:]:
        throughput = size / seconds_by_size[size]
        if throughput < best * (1 + margin):
            break
        chosen, best = size, throughput
    return chosen


def measured_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """The batch sizes a worker measures: the powers of two below ``max_num_seqs``, and ``max_num_seqs``."""
    sizes = {max_num_seqs}
    size = 1
    while size < max_num_seqs:
        sizes.add(size)
        size *= 2
    return tuple(sorted(sizes))


class KneeTable:
    """Seconds per step by shape and batch size for one model on one device, kept in ``path`` (JSON) when given.
    Thread-safe; a file that cannot be read starts an empty table, one that cannot be written is logged."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seconds: dict[str, dict[int, float]] = self._read() if path is not None else {}

    def _read(self) -> dict[str, dict[int, float]]:
        assert self.path is not None
        try:
            raw = json.loads(self.path.read_text())
            return {
                str(shape): {int(size): float(s) for size, s in sizes.items() if float(s) > 0}
                for shape, sizes in raw.items()
            }
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("batch knee table %s unreadable (%s): measured again", self.path, exc)
            return {}

    def set(self, shape: str, size: int, step_s: float) -> None:
        """A measurement of ``size`` requests of ``shape``: ``step_s`` seconds per denoising step."""
        if size >= 1 and step_s > 0:
            with self._lock:
                self._seconds.setdefault(shape, {})[size] = step_s

    def observe(self, shape: str, size: int, seconds: float, steps: int) -> None:
        """A live forward of ``size`` requests of ``shape`` took ``seconds`` over ``steps`` steps: folded into the
        moving average (the first one of a size is taken as it is)."""
        if size < 1 or steps < 1 or seconds <= 0:
            return
        step_s = seconds / steps
        with self._lock:
            sizes = self._seconds.setdefault(shape, {})
            old = sizes.get(size)
            sizes[size] = step_s if old is None else (1 - LIVE_WEIGHT) * old + LIVE_WEIGHT * step_s

    def clear(self, shape: str) -> None:
        """Forget ``shape``'s measurements (a warm-up forward is not one)."""
        with self._lock:
            self._seconds.pop(shape, None)

    def seconds(self, shape: str) -> dict[int, float]:
        """Seconds per step by batch size at ``shape`` (empty when never measured)."""
        with self._lock:
            return dict(self._seconds.get(shape, {}))

    def shapes(self) -> list[str]:
        with self._lock:
            return sorted(self._seconds)

    def knees(self, margin: float) -> dict[str, int]:
        """The knee of every measured shape."""
        found = {shape: knee(self.seconds(shape), margin) for shape in self.shapes()}
        return {shape: size for shape, size in found.items() if size is not None}

    def save(self) -> None:
        """Write the table to ``path`` atomically (a temporary file renamed); a failure is logged, not raised."""
        if self.path is None:
            return
        with self._lock:
            text = json.dumps({shape: {str(k): v for k, v in sizes.items()} for shape, sizes in self._seconds.items()})
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".knee-")
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
            os.replace(temporary, self.path)
        except OSError as exc:
            log.warning("batch knee table %s not saved: %s", self.path, exc)
