"""Per-GPU speed that keeps outputs exact: the prompt-embedding cache (``gpu_worker.prompt_cache``), batches capped
where batching stops paying (``gpu_worker.batch_knee``)."""

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

    batch_knee_margin: float = Field(0.1, ge=0)
    """Batch only where it pays: a worker announces, per model and request pixel cost, the largest batch up to which
    each doubling gains at least this much throughput (0.1: ten percent) by its measured forward times, and the
    scheduler caps batches there (never above max_num_seqs; gpu_worker/batch_knee.py)."""
