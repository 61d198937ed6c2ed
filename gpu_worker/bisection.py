"""What a worker does when a fused call of several requests raises: the one failure policy of the executor's
forwards (``gpu_worker.executor``) and the step loop's steps (``gpu_worker.step_loop``).

``bisect_on_failure(rows, how)`` runs the rows (request ids) in one call; when it raises:

* out of memory (``is_out_of_memory``): the runner's cache is emptied and the rows are run as two halves (the first
  one the larger), each of which fails the same way, recursively, down to single rows;
* anything else: the rows are run one by one;
* a single row whose call raises fails alone (``Rows.fail``) with the exception's type and message, or with
  ``OutOfMemory`` ("does not fit in memory alone: ...", the cache emptied) when it ran out of memory.

So only the culprits fail and their peers' calls go on. ``SoftTimeLimitExceeded`` (and what ``Rows.passes`` names)
is raised at once: it is not the rows' fault. Rows no longer ``Rows.live`` (aborted while a call ran) are not run
again. ``one_by_one(rows, how)`` is the last resort on its own, for a runner that is not fused. Each returns what
the calls that succeeded returned, in order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from celery.exceptions import SoftTimeLimitExceeded

from gpu_worker.log_context import ids
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.result_writer import error_info
from shared.contracts import ErrorInfo

T = TypeVar("T")


def is_out_of_memory(exc: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError, a host MemoryError, or a backend's 'out of memory' RuntimeError."""
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc)


def _always(_: str) -> bool:
    return True


def _never(_: Exception) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Rows(Generic[T]):
    """How to run some of the rows in one call (``run``), end one that fails alone (``fail``) and free the runner's
    memory; ``what`` a call is (``"fused forward"``, ``"step"``) and ``log`` the caller's logger, for the log lines."""

    run: Callable[[Sequence[str]], T]
    fail: Callable[[str, ErrorInfo], None]
    release_memory: Callable[[], None]
    what: str
    log: logging.Logger
    metrics: WorkerMetrics | None = None
    live: Callable[[str], bool] = _always
    """Whether a row is still to run (False: it ended while a call ran, aborted)."""
    passes: Callable[[Exception], bool] = _never
    """Failures that are not the rows' (a Redis outage): raised at once, as ``SoftTimeLimitExceeded`` is."""


def bisect_on_failure(rows: Sequence[str], how: Rows[T], *, whole: Callable[[], T] | None = None) -> list[T]:
    """Run ``rows`` in one call (``whole``, when it runs them other than ``how.run(rows)`` does), then as the
    module's docstring says when it raises; what each call that succeeded returned."""
    if not whole:
        return _attempt(rows, how)
    return _call(rows, how, whole)


def one_by_one(rows: Sequence[str], how: Rows[T]) -> list[T]:
    """Run each of ``rows`` alone; one whose call raises fails alone (see the module's docstring)."""
    return [result for row in rows for result in _attempt([row], how)]


def _attempt(rows: Sequence[str], how: Rows[T]) -> list[T]:
    if not rows or (len(rows) == 1 and not how.live(rows[0])):
        return []
    return _call(rows, how, lambda: how.run(rows))


def _call(rows: Sequence[str], how: Rows[T], call: Callable[[], T]) -> list[T]:
    try:
        return [call()]
    except SoftTimeLimitExceeded:
        raise
    except Exception as exc:
        if how.passes(exc):
            raise
        if len(rows) == 1:
            _fail_alone(rows[0], exc, how)
            return []
        return _split(rows, exc, how)


def _split(rows: Sequence[str], exc: Exception, how: Rows[T]) -> list[T]:
    rows = [row for row in rows if how.live(row)]  # ended meanwhile: not run again
    if is_out_of_memory(exc):
        how.release_memory()
        if how.metrics is not None:
            how.metrics.oom_split()
        half = (len(rows) + 1) // 2
        how.log.warning("out of memory in a %s of %d requests; splitting them in two", how.what, len(rows))
        return _attempt(rows[:half], how) + _attempt(rows[half:], how)
    how.log.exception("%s of %d requests failed; re-running them one by one", how.what, len(rows))
    return one_by_one(rows, how)


def _fail_alone(row: str, exc: Exception, how: Rows[T]) -> None:
    error = error_info(exc)
    if is_out_of_memory(exc):
        how.release_memory()
        error = ErrorInfo(type="OutOfMemory", message=f"does not fit in memory alone: {error.message}")
    how.log.warning("request %s failed: %s: %s", row, error.type, error.message, extra=ids(request_id=row))
    how.fail(row, error)
