"""Bounding every call to a result store whose backend may hang (a folder on a network mount, S3).

A filesystem write on a stuck NFS mount blocks in the kernel with no timeout of its own, and botocore's timeouts
bound each socket read, not a call (an endpoint that trickles its answer never trips them). ``DeadlineStore`` runs
each call in a daemon thread of its own and waits for it at most ``timeout_s``; past that the caller gets
``ResultStoreTimeout`` and the thread is left to the backend. A worker then counts itself stuck and is replaced
(``gpu_worker.finisher``); the api answers 503; the sweeper tries again later. At most ``max_calls`` calls (default
``MAX_CALLS``) run in the backend at a time, in flight or left hanging: past that every call fails at once, so a
store that hangs cannot pile up threads, however many callers call at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from shared.results.store import ResultStore, ResultStoreError, ResultStoreTimeout, put_each

T = TypeVar("T")

MAX_CALLS = 8
"""Calls running in the backend at once (in flight, or outlived their deadline and still running), at most; beyond
it the store is refused at once."""


class DeadlineStore:
    """``inner`` with each ``put`` (``put_many``: each of its puts), ``get`` and ``delete`` bounded by ``timeout_s``
    (``url`` presigns locally), at most ``max_calls`` of them running at once."""

    def __init__(self, inner: ResultStore, timeout_s: float, *, max_calls: int = MAX_CALLS) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.timeout_s = timeout_s
        self.max_calls = max_calls
        self._lock = threading.Lock()
        self._running = 0  # calls whose thread is still in the backend

    def put(self, key: str, data: bytes) -> None:
        self._call(lambda: self.inner.put(key, data), f"storing {key}")

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> dict[str, ResultStoreError]:
        return put_each(self, items)

    def get(self, key: str) -> bytes | None:
        return self._call(lambda: self.inner.get(key), f"reading {key}")

    def delete(self, keys: Sequence[str]) -> None:
        self._call(lambda: self.inner.delete(keys), f"deleting {len(keys)} objects")

    def url(self, key: str) -> str | None:
        return self.inner.url(key)

    def _call(self, call: Callable[[], T], what: str) -> T:
        with self._lock:
            if self._running >= self.max_calls:
                raise ResultStoreTimeout(
                    f"{what} refused: {self._running} calls to the {self.kind} result store have not returned"
                )
            self._running += 1
        done = threading.Event()
        outcome: list[T] = []
        failure: list[BaseException] = []

        def run() -> None:
            try:
                outcome.append(call())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                failure.append(exc)
            finally:
                with self._lock:
                    done.set()
                    self._running -= 1

        threading.Thread(target=run, name=f"{self.kind}-store-call", daemon=True).start()
        if not done.wait(self.timeout_s):
            with self._lock:
                abandoned = not done.is_set()
            if abandoned:
                raise ResultStoreTimeout(
                    f"{what} in the {self.kind} result store did not return within {self.timeout_s:g} s "
                    "(result_store_timeout_s)"
                )
        if failure:
            raise failure[0]
        return outcome[0]
