"""Per-GPU speed that keeps outputs exact: the prompt-embedding cache (``gpu_worker.prompt_cache``)."""

from __future__ import annotations

from pydantic import Field

from shared.settings.concern import SettingsConcern


class AccelerationSettings(SettingsConcern):
    """How a worker saves work inside its pipeline without changing a request's output."""

    section = "Acceleration"

    prompt_cache_entries: int = Field(1024, ge=0)
    """Encoded prompts (each with its negative prompt) a worker keeps per model, least recently used dropped first,
    so a repeated prompt and a shared negative prompt are encoded once; 0 = no prompt cache."""

    prompt_cache_mb: float = Field(256.0, ge=0)
    """Bound on the memory (on the model's device) the prompt cache of one model holds, in MiB; an encoded prompt
    larger than this is not kept."""
