"""Step mode: step-level denoising over a set of rows that changes between steps (docs/step_mode.md).

``StepEngine(pipe, width, height)`` runs rows (``Row``; ``rows_of(spec)`` makes a request's) through one fused
denoiser call per ``step()``; rows join and leave at step boundaries. ``step_key`` says which requests may share a
running set. ``ADAPTERS`` names the families with adapters, and each adapter's ``tasks`` the tasks its rows carry
(docs/step_mode.md, *Per-family adapters*); every other family stays request-level.
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
