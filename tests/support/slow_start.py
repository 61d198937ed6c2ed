"""A runner that takes a while to load, like a real model does (plugged in by ``FUSEFLEET_RUNNER``)."""

from __future__ import annotations

import time

from bench.runners import NullRunner
from shared.settings import Settings

LOAD_S = 6.0  # longer than Celery's default worker_proc_alive_timeout (4 s)


class SlowStartRunner(NullRunner):
    """The null runner, after a ``LOAD_S`` second "model load" in the pool process."""

    def __init__(self, settings: Settings) -> None:
        time.sleep(LOAD_S)
        super().__init__(settings)
