"""Bounding every call to a result store whose backend may hang (a folder on a network mount, S3).

A filesystem write on a stuck NFS mount blocks in the kernel with no timeout of its own, and botocore's timeouts
bound each socket read, not a call (an endpoint that trickles its answer never trips them). ``DeadlineStore`` runs
each call in a daemon thread of its own and waits for it at most ``timeout_s``; past that the caller gets
``ResultStoreTimeout`` and the thread is left to the backend. A worker then counts itself stuck and is replaced
(``gpu_worker.finisher``); the api answers 503; the sweeper tries again later. At most ``MAX_ABANDONED`` calls are
left hanging at a time: past that every call fails at once, so a store that hangs cannot pile up threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from shared.results.store import ResultStore, ResultStoreTimeout

T = TypeVar("T")

MAX_ABANDONED = 8
"""Calls that outlived their deadline and still run, at most; beyond it the store is refused at once."""


class DeadlineStore:
    """``inner`` with each ``put``, ``get`` and ``delete`` bounded by ``timeout_s`` (``url`` presigns locally)."""

    def __init__(self, inner: ResultStore, timeout_s: float) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._abandoned = 0

    def put(self, key: str, data: bytes) -> None:
        self._call(lambda: self.inner.put(key, data), f"storing {key}")

    def get(self, key: str) -> bytes | None:
        return self._call(lambda: self.inner.get(key), f"reading {key}")

    def delete(self, keys: Sequence[str]) -> None:
        self._call(lambda: self.inner.delete(keys), f"deleting {len(keys)} objects")

    def url(self, key: str) -> str | None:
        return self.inner.url(key)

    def _call(self, call: Callable[[], T], what: str) -> T:
        with self._lock:
            if self._abandoned >= MAX_ABANDONED:
                raise ResultStoreTimeout(
                    f"{what} refused: {self._abandoned} calls to the {self.kind} result store have not returned"
                )
        done = threading.Event()
        outcome: list[T] = []
        failure: list[BaseException] = []
        abandoned = False

        def run() -> None:
            nonlocal abandoned
            try:
                outcome.append(call())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                failure.append(exc)
            finally:
                with self._lock:
                    done.set()
                    if abandoned:
                        self._abandoned -= 1

        threading.Thread(target=run, name=f"{self.kind}-store-call", daemon=True).start()
        if not done.wait(self.timeout_s):
            with self._lock:
                if not done.is_set():
                    abandoned = True
                    self._abandoned += 1
            if abandoned:
                raise ResultStoreTimeout(
                    f"{what} in the {self.kind} result store did not return within {self.timeout_s:g} s "
                    "(result_store_timeout_s)"
                )
        if failure:
            raise failure[0]
        return outcome[0]
