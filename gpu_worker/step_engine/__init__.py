"""Step mode: step-level denoising over a set of rows that changes between steps (docs/step_mode.md).

``StepEngine(pipe, width, height)`` runs rows (``Row``; ``rows_of(spec)`` makes a request's) through one fused
denoiser call per ``step()``; rows join and leave at step boundaries. ``step_key`` says which requests may share a
running set. Stable Diffusion 1.x/2.x and Stable Diffusion 3 have adapters; every other family stays request-level.
"""

from gpu_worker.step_engine.engine import ADAPTERS, StepEngine, UnsupportedPipeline, step_tasks, supports
from gpu_worker.step_engine.rows import Finished, Row, RowProgress, rows_of
from shared.compat import PER_ROW, StepKey, step_key

__all__ = [
    "ADAPTERS",
    "PER_ROW",
    "Finished",
    "Row",
    "RowProgress",
    "StepEngine",
    "StepKey",
    "UnsupportedPipeline",
    "rows_of",
    "step_key",
    "step_tasks",
    "supports",
]
