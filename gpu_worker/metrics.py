"""What only a worker knows, added to the fleet's metrics in Redis (``shared.metrics``): forward time by batch
size, step time, images produced, out-of-memory splits.

``WorkerMetrics`` is best effort and never in the forward's way: ``forward()`` and ``oom_split()`` only add to
an in-memory tally (microseconds, never raise); a daemon thread writes the tally with one ``metrics_add.lua`` call
as soon as there is something, then at most once per ``WRITE_EVERY_S`` (what a busy worker records meanwhile goes in
the next call: one Redis call a second however many forwards; ``flush`` and ``close`` write at once). A write
that fails (Redis away or stalled: within the client's bound, its socket timeout per attempt times its retries) is
logged and its increments are dropped, not retried, so nothing is ever
counted twice; the tally meanwhile keeps one entry per field, so memory stays bounded however long Redis is away.

The worker creates one per pool process and calls ``forward`` after each forward that returned its outputs,
``oom_split`` where a fused forward is halved, and ``close`` at shutdown.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter

import redis

from shared.keys import METRICS_ADD, RedisKeys
from shared.metrics import (
    OOM_SPLIT_INCREMENTS,
    RECENT_SLOTS,
    forward_increments,
    model_eviction_increments,
    model_load_increments,
    prompt_cache_increments,
)

log = logging.getLogger(__name__)
WRITE_EVERY_S = 1.0  # at most one metrics write this often (the fleet's metrics lag by at most this)


class WorkerMetrics:
    """The metrics of one worker process, written to Redis by a thread of its own (started on first use, and
    again in a forked child)."""

    def __init__(self, client: redis.Redis, keys: RedisKeys) -> None:
        self._keys = keys
        self._add = client.register_script(METRICS_ADD)
        self._setup()

    def _setup(self) -> None:
        self._pid = os.getpid()
        self._changed = threading.Condition()
        self._pending: Counter[str] = Counter()  # field -> increment not written yet
        self._images = 0  # for the throughput ring, not written yet
        self._writing = False
        self._hurry = 0  # flush or close calls waiting: write now, not at the next interval
        self._closed = False
        self._thread: threading.Thread | None = None

    def forward(self, batch_size: int, images: int, steps: int, seconds: float) -> None:
        """One forward of ``batch_size`` requests produced ``images`` outputs (images or videos) in ``steps``
        denoising steps and ``seconds`` (wall time of the forward)."""
        self._record(forward_increments(batch_size, images, steps, seconds), images)

    def oom_split(self) -> None:
        """A fused forward ran out of memory and is split in two."""
        self._record(OOM_SPLIT_INCREMENTS, 0)

    def model_loaded(self, model: str, seconds: float) -> None:
        """The worker loaded ``model`` (at start, or on demand for a batch of it) in ``seconds``."""
        self._record(model_load_increments(model, seconds), 0)

    def model_evicted(self, model: str) -> None:
        """The worker evicted ``model`` to make room for another (``gpu_worker.residency``)."""
        self._record(model_eviction_increments(model), 0)

    def prompt_cache(self, hits: int, misses: int) -> None:
        """One encode of a batch's prompts found ``hits`` rows in the prompt cache and encoded ``misses``."""
        if hits or misses:
            self._record(prompt_cache_increments(hits, misses), 0)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until what was recorded so far is written (or dropped); False if that took over ``timeout_s``."""
        with self._changed:
            self._hurry += 1
            self._changed.notify_all()
            try:
                return self._changed.wait_for(lambda: not (self._pending or self._images or self._writing), timeout_s)
            finally:
                self._hurry -= 1

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is left (within ``timeout_s``) and stop the thread."""
        self.flush(timeout_s)
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _record(self, increments: dict[str, float], images: int) -> None:
        try:
            if os.getpid() != self._pid:  # forked: the parent's thread and condition are not this process's
                self._setup()
            with self._changed:
                self._pending.update(increments)
                self._images += images
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._loop, name="fusefleet-metrics", daemon=True)
                    self._thread.start()
                self._changed.notify_all()
        except Exception as exc:  # noqa: BLE001 - metrics must never fail a forward
            log.warning("metrics not recorded: %s", exc)

    def _loop(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending or self._images or self._closed)
                if self._closed and not (self._pending or self._images):
                    return
                pending, images = self._pending, self._images
                self._pending, self._images, self._writing = Counter(), 0, True
            try:
                self._write(pending, images)
            except Exception as exc:  # noqa: BLE001 - dropped: a retry could count them twice
                log.warning("metrics write failed, %d increments dropped: %s", len(pending), exc)
            finally:
                with self._changed:
                    self._writing = False
                    self._changed.notify_all()
                    self._changed.wait_for(lambda: self._hurry > 0 or self._closed, WRITE_EVERY_S)

    def _write(self, pending: Counter[str], images: int) -> None:
        args: list[str | int] = [images, RECENT_SLOTS]
        for name, increment in pending.items():
            args += [name, repr(float(increment))]
        self._add(keys=[self._keys.metrics, self._keys.metrics_recent], args=args)
