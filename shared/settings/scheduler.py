"""The scheduler process: its lease (one active scheduler, standbys) and its stream reads."""

from __future__ import annotations

from pydantic import Field

from shared.settings.concern import SettingsConcern


class SchedulerSettings(SettingsConcern):
    """The active scheduler's lease and how it reads the request stream."""

    section = "Scheduler"

    scheduler_lease_ms: int = Field(5000, ge=100)
    """TTL of the active scheduler's lease; a standby takes over within about this long."""

    scheduler_block_ms: int = Field(500, ge=1, le=4000)
    """Longest blocking stream read of the scheduler between housekeeping rounds."""

    scheduler_read_count: int = Field(1000, ge=1)
    """Most stream entries read per round."""
