"""The worker: its heartbeat and liveness, a batch task's limits and lock, the poison-request guard, the reaper's
timeouts."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from shared.settings.concern import SettingsConcern


class WorkerSettings(SettingsConcern):
    """How workers announce themselves and hold their batches, and how long a batch may run or wait."""

    section = "Worker"

    worker_name: str | None = None
    """Celery node name of this worker; unset = fusefleet-worker@<host>-<random>, unique per process."""

    worker_heartbeat_s: float = Field(1.0, gt=0)
    """Seconds between worker heartbeats."""

    worker_ttl_s: float = Field(5.0, gt=0)
    """A worker silent this long no longer counts as a free slot."""

    worker_quarantine_s: float = Field(300.0, gt=0)
    """How long a worker whose result store hung under it (a write past result_store_timeout_s) counts as no slot: it
    gives its batches back uncounted (no lost run), and its next pool process takes no batch until then; then it probes
    its store with the next batch."""

    batch_time_limit_s: int = Field(900, ge=10)
    """Hard limit of one batch task; the soft limit (failing its requests) is 90% of it."""

    visibility_timeout_s: int = Field(3600, ge=60)
    """Celery Redis visibility timeout; must exceed batch_time_limit_s."""

    batch_lock_ttl_s: float = Field(10.0, gt=0)
    """TTL of a running batch's ownership lock (renewed by heartbeats): bounds takeover after a crash."""

    max_batch_attempts: int = Field(3, ge=1)
    """Lost runs of one request running alone (its worker died, hit the hard time limit or lost Redis) before it fails
    WorkerLost: a lost run of several requests is re-run in halves down to one request, so only the request that kills
    its worker fails (poison-request guard), and a loss that is not its fault (a restart) fails a request only if it is
    lost this many times alone. Deliveries that run nothing do not count."""

    batch_claim_timeout_s: float = Field(30.0, gt=0)
    """A published batch that no worker claimed for this long, and whose message is in none of the fleet's broker
    queues (lost: the shared queue and each worker's own), is published again by the scheduler's reaper."""

    worker_lookahead_s: float = Field(0.1, ge=0)
    """How long before its forward's estimated end (from the forward's steps so far) a busy worker takes its next
    batch from its queue and claims it, so that the next forward starts as soon as this one ends, in the same task (a
    fleet of one model, request-level mode; gpu_worker/lookahead.py). A busy worker holds a batch an idle one could
    run about this long at most. 0 turns it off: the next batch then comes through Celery once the forward ends."""

    worker_start_timeout_s: float = Field(900.0, gt=0)
    """How long a worker pool process may take to start (model load included) before Celery gives up on it (Celery's
    worker_proc_alive_timeout, 4 s by default, far too short for a real model)."""

    @model_validator(mode="after")
    def _batch_timing_fits(self) -> Self:
        if self.worker_heartbeat_s * 2 > self.batch_lock_ttl_s:
            raise ValueError(
                f"worker_heartbeat_s ({self.worker_heartbeat_s}) must be at most half of batch_lock_ttl_s "
                f"({self.batch_lock_ttl_s}): the heartbeat renews a running batch's lock, which would lapse mid-run"
            )
        if self.visibility_timeout_s <= self.batch_time_limit_s:
            raise ValueError(
                f"visibility_timeout_s ({self.visibility_timeout_s}) must exceed batch_time_limit_s "
                f"({self.batch_time_limit_s}): Celery would deliver a running batch again"
            )
        return self

    @property
    def soft_time_limit_s(self) -> int:
        """Soft limit of a batch task: the task then fails its unfinished requests itself."""
        return max(1, int(self.batch_time_limit_s * 0.9))
