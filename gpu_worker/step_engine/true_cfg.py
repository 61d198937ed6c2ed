"""True classifier-free guidance per row, for the guidance-distilled families that take it (Flux, Qwen-Image).

Their pipelines guide by the negative prompt only when ``true_cfg_scale > 1`` *and* a negative prompt is given
(``do_true_cfg``), with ``true_cfg_scale`` rather than ``guidance_scale`` (which, where the transformer has
``guidance_embeds``, is an embedding per row instead). A row carries its own ``true_cfg_scale`` (None: the
pipeline's default, Flux 1.0, Qwen-Image 4.0) and negative prompt, so rows guided and unguided, at any scales,
share one running set: ``true_cfg_scale`` is no step-key field (``BatchKey(step=False)``).

The pipelines run the negative branch as a second transformer call of the same batch; the engine puts the guided
rows' negative halves in its one call, so a guided row equals its pipeline call within the rounding of the batch
(docs/step_mode.md), and an unguided one bit for bit.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from gpu_worker.step_engine.adapter import Canvas, FamilyAdapter
from gpu_worker.step_engine.rows import Row


class TrueCfgAdapter(FamilyAdapter):
    """A family adapter whose rows are guided by their negative prompt with their own ``true_cfg_scale``."""

    rescales_guidance: ClassVar[bool] = False

    def __init__(self, pipe: Any, canvas: Canvas) -> None:
        super().__init__(pipe, canvas)
        self.default_true_cfg = float(self.call_default("true_cfg_scale"))

    def true_cfg(self, row: Row) -> float:
        """The row's true CFG scale: its own, else the pipeline's default."""
        return self.default_true_cfg if row.true_cfg_scale is None else row.true_cfg_scale

    def guided(self, row: Row) -> bool:
        """The pipeline's ``do_true_cfg``: a negative prompt and a true CFG scale above 1."""
        return row.negative_prompt is not None and self.true_cfg(row) > 1.0

    def guide(self, uncond: torch.Tensor, cond: torch.Tensor, row: Row) -> torch.Tensor:
        """``neg + true_cfg_scale (cond - neg)``, as the pipelines combine their two calls."""
        return uncond + self.true_cfg(row) * (cond - uncond)
