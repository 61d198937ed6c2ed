"""``gpu_worker.bisection``: the one failure policy of the executor's forwards and the step loop's steps, on a
scripted call that runs out of memory above a size or raises for its culprits."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from gpu_worker.bisection import Rows, bisect_on_failure, is_out_of_memory, one_by_one
from shared.contracts import ErrorInfo

log = logging.getLogger(__name__)


class Calls:
    """A scripted call: out of memory above ``fits`` rows, ValueError for a call with a culprit in it."""

    def __init__(self, fits: int = 100, culprits: Sequence[str] = (), raises: Exception | None = None) -> None:
        self.fits = fits
        self.culprits = set(culprits)
        self.raises = raises
        self.calls: list[list[str]] = []
        self.failed: dict[str, ErrorInfo] = {}
        self.released = 0
        self.ended: set[str] = set()
        self.during: Callable[[list[str]], None] | None = None

    def run(self, rows: Sequence[str]) -> list[str]:
        self.calls.append(list(rows))
        if self.during is not None:
            self.during(list(rows))
        if self.raises is not None:
            raise self.raises
        if len(rows) > self.fits:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if culprits := self.culprits & set(rows):
            raise ValueError(f"{sorted(culprits)[0]} asked the pipeline to explode")
        return list(rows)

    def rows(self, **extra: object) -> Rows[list[str]]:
        return Rows(
            run=self.run,
            fail=self.failed.__setitem__,
            release_memory=self.release,
            what="fused forward",
            log=log,
            live=lambda row: row not in self.ended,
            **extra,  # type: ignore[arg-type]
        )

    def release(self) -> None:
        self.released += 1


ROWS = ["a", "b", "c", "d", "e"]


def test_a_call_that_succeeds_runs_once() -> None:
    calls = Calls()
    assert bisect_on_failure(ROWS, calls.rows()) == [ROWS]
    assert calls.calls == [ROWS] and not calls.failed and calls.released == 0


def test_out_of_memory_halves_the_rows_the_first_half_the_larger_down_to_what_fits() -> None:
    calls = Calls(fits=2)
    assert bisect_on_failure(ROWS, calls.rows()) == [["a", "b"], ["c"], ["d", "e"]]
    assert calls.calls == [ROWS, ["a", "b", "c"], ["a", "b"], ["c"], ["d", "e"]]
    assert calls.released == 2 and not calls.failed


def test_a_single_row_that_does_not_fit_fails_out_of_memory_and_its_peers_run() -> None:
    calls = Calls(fits=0)
    assert bisect_on_failure(["a", "b"], calls.rows()) == []
    assert calls.calls == [["a", "b"], ["a"], ["b"]]
    assert calls.released == 3  # the split, then each single row
    for row in ("a", "b"):
        error = calls.failed[row]
        assert error.type == "OutOfMemory"
        assert error.message == "does not fit in memory alone: CUDA out of memory. Tried to allocate 2.00 GiB"


def test_another_failure_runs_the_rows_one_by_one_and_only_the_culprit_fails() -> None:
    calls = Calls(culprits=["c"])
    assert bisect_on_failure(ROWS, calls.rows()) == [["a"], ["b"], ["d"], ["e"]]
    assert calls.calls == [ROWS, ["a"], ["b"], ["c"], ["d"], ["e"]]
    assert calls.failed == {"c": ErrorInfo(type="ValueError", message="c asked the pipeline to explode")}
    assert calls.released == 0  # not a memory failure: the cache is left alone


def test_a_half_that_fails_otherwise_is_run_one_by_one() -> None:
    calls = Calls(fits=3, culprits=["e"])
    assert bisect_on_failure(ROWS, calls.rows()) == [["a", "b", "c"], ["d"]]
    assert calls.calls == [ROWS, ["a", "b", "c"], ["d", "e"], ["d"], ["e"]]
    assert list(calls.failed) == ["e"]


def test_rows_that_ended_while_a_call_ran_are_not_run_again() -> None:
    calls = Calls(culprits=["a"])
    calls.during = lambda rows: calls.ended.add("b") if len(rows) > 1 else None  # b aborted during the fused call
    assert bisect_on_failure(["a", "b", "c"], calls.rows()) == [["c"]]
    assert calls.calls == [["a", "b", "c"], ["a"], ["c"]]
    assert list(calls.failed) == ["a"]


def test_a_single_row_that_ended_before_its_call_is_not_run() -> None:
    calls = Calls()
    calls.ended.add("a")
    assert bisect_on_failure(["a"], calls.rows()) == []
    assert one_by_one(["a", "b"], calls.rows()) == [["b"]]
    assert calls.calls == [["b"]]


def test_whole_runs_the_first_call_and_a_single_row_fails_alone() -> None:
    calls = Calls(culprits=["a"])
    wholes: list[str] = []

    def whole() -> list[str]:
        wholes.append("every live row")
        return calls.run(["a"])

    assert bisect_on_failure(["a"], calls.rows(), whole=whole) == []
    assert wholes == ["every live row"] and calls.calls == [["a"]]  # not run again alone
    assert list(calls.failed) == ["a"]


def test_whole_is_the_first_call_only() -> None:
    calls = Calls(fits=1)
    assert bisect_on_failure(["a", "b"], calls.rows(), whole=lambda: calls.run(["a", "b"])) == [["a"], ["b"]]
    assert calls.calls == [["a", "b"], ["a"], ["b"]]


@pytest.mark.parametrize("exc", [SoftTimeLimitExceeded(), ConnectionError("Redis went away")])
def test_the_time_limit_and_what_passes_are_raised_at_once(exc: Exception) -> None:
    calls = Calls(raises=exc)
    with pytest.raises(type(exc)):
        bisect_on_failure(ROWS, calls.rows(passes=lambda e: isinstance(e, ConnectionError)))
    assert calls.calls == [ROWS] and not calls.failed


def test_without_passes_an_outage_is_the_rows_failure() -> None:
    calls = Calls(raises=ConnectionError("Redis went away"))
    assert one_by_one(["a"], calls.rows()) == []
    assert calls.failed == {"a": ErrorInfo(type="ConnectionError", message="Redis went away")}


def test_one_by_one_never_calls_the_rows_together() -> None:
    calls = Calls(culprits=["b"])
    assert one_by_one(["a", "b", "c"], calls.rows()) == [["a"], ["c"]]
    assert calls.calls == [["a"], ["b"], ["c"]]


@pytest.mark.parametrize(
    "exc, expected",
    [
        (MemoryError(), True),
        (type("OutOfMemoryError", (RuntimeError,), {})("CUDA"), True),
        (RuntimeError("MPS backend out of memory"), True),
        (RuntimeError("shape mismatch"), False),
    ],
)
def test_what_counts_as_out_of_memory(exc: BaseException, expected: bool) -> None:
    assert is_out_of_memory(exc) is expected
