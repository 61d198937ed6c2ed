"""The result sweeper: deletes the result-store objects that fell due in the results journal.

Due objects are those of expired requests (their due time is their request's expiry), of deleted requests (due at
once), of aborted ones, and of runs that stored images but never finished (due ``result_orphan_grace_s`` after the
run claimed its batch: killed between storing and finishing, or fenced off as a late writer). Taking keys is
atomic (``results_due.lua``), so any number of sweepers can run; each scheduler process runs one in a thread.
A key whose deletion fails is taken again after ``RETRY_S``.
"""

from __future__ import annotations

import logging
import threading
import time

from shared.results import ResultJournal, ResultStore
from shared.retry import repeat_until

log = logging.getLogger(__name__)

PAGE = 1000  # keys taken (and deleted in one call where the store can) at a time
RETRY_S = 60.0  # a taken key whose deletion was not confirmed is taken again after this long
ROUND_BUDGET_S = 5.0  # one round stops taking pages after this long (the rest waits for the next round)


class ResultSweeper:
    def __init__(self, journal: ResultJournal, results: ResultStore, *, interval_s: float) -> None:
        self._journal = journal
        self._results = results
        self._interval_s = interval_s

    def sweep(self) -> int:
        """Delete what is due now (page by page, within ``ROUND_BUDGET_S``); the number of objects deleted."""
        deleted = 0
        started = time.monotonic()
        while time.monotonic() - started < ROUND_BUDGET_S:
            keys = self._journal.take_due(PAGE, RETRY_S)
            if not keys:
                break
            self._results.delete(keys)
            self._journal.deleted(keys)
            deleted += len(keys)
            if len(keys) < PAGE:
                break
        if deleted:
            log.info("swept %d result objects from the %s result store", deleted, self._results.kind)
        return deleted

    def run(self, stop: threading.Event) -> None:
        """Sweep every ``interval_s`` until ``stop`` is set; a failing round (Redis or the store away) is retried
        with a backoff, never ends the loop."""
        repeat_until(stop, self._interval_s, self.sweep, what="result sweep", backoff_cap_s=max(self._interval_s, 5.0))

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="result-sweeper", daemon=True)
        thread.start()
        return thread
