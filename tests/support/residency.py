"""A runner whose model loads take a while once a process loaded that model before (plugged in by
``FUSEFLEET_RUNNER``): a worker's start (each model's first load) is quick, a load on demand takes ``LOAD_S``, so a
test can kill a worker in the middle of one."""

from __future__ import annotations

import time

from shared.settings import Settings
from tests.support.runners import ChaosRunner

LOAD_S = 3.0
"""Seconds of each load of a model this process loaded before."""

_loaded: set[str] = set()  # the demo families this process constructed a runner for


class SlowReloadRunner(ChaosRunner):
    """``ChaosRunner``, constructed at once the first time for its model in a process, after ``LOAD_S`` after."""

    def __init__(self, settings: Settings) -> None:
        if settings.demo_family in _loaded:
            time.sleep(LOAD_S)
        _loaded.add(settings.demo_family)
        super().__init__(settings)
