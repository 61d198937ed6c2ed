"""LTX-Video's image-to-video rows (task ``image-to-image``: the request's image is the first frame) in a running set.

:class:`LtxImageToVideo` is the mixin of the LTX-Video adapter; it mirrors ``LTXImageToVideoPipeline`` (diffusers
0.42), the request-level runner's pipeline for the task, built on the same components, per row:

* no strength: every row runs its whole schedule (the pipeline takes none; a request's strength is not used);
* the row's generator draws, in the pipeline's ``prepare_latents`` order, its image's latents (the image at the
  canvas's size through the VAE as a one-frame video, a sample, normalised by ``latents_mean`` / ``latents_std``),
  then its noise for the whole video; the first latent frame is the image's latents, every later one the noise
  (``init x mask + noise x (1 - mask)``, the conditioning mask 1 on the first frame), packed into tokens;
* **a timestep per token**: the transformer takes ``t x (1 - conditioning mask)`` (0 on the first frame's tokens).
  The row's halves carry its packed conditioning mask (``conditioning_mask``); a call whose batch has an image
  row gives every row a ``(tokens,)`` timestep (a text row's all ``t``), a call of text rows alone the ``(batch,)``
  one as before (:func:`timestep_of`);
* guidance over every token, as the pipeline (its rescale's deviation counts the first frame too);
* **the first frame is kept**: the pipeline steps only the later frames (``scheduler.step`` on
  ``latents[:, :, 1:]``); the engine steps the row's whole latents and :class:`FirstFrame` puts the first frame's
  tokens back after each step. A flow-matching Euler step is elementwise, so the later frames are what the
  pipeline computes bit for bit (a scheduler whose step mixes elements, or one with ``stochastic_sampling``,
  would differ; the family's is neither);
* decoding as text-to-video (the same VAE, denormalisation and decode timestep).

Text-to-video and image-to-video rows of one canvas (size, frames, fps) share a set: they differ only in their own
latents, their halves' conditioning mask and the first frame kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gpu_worker.step_engine.image_task import Inpainting
from gpu_worker.step_engine.rows import Row
from shared.contracts import Task

CONDITIONING_MASK = "conditioning_mask"
"""The halves' key of an image-to-video row's packed conditioning mask, ``(1, tokens)``: 1 on the first frame."""


class FirstFrame(Inpainting):
    """An image-to-video row's condition: its initial latents (``image_latents``, packed; the first frame's tokens
    are the image's), its packed noise, and the tokens it denoises (``mask``, ``(1, tokens, 1)``: 0 on the first
    frame, 1 elsewhere). The denoiser takes no extra input."""

    __slots__ = ()

    def after_step(self, latents: torch.Tensor, scheduler: Any, next_timestep: torch.Tensor | None) -> torch.Tensor:
        """The row's latents after its scheduler step with the first frame's tokens put back (never noised)."""
        assert self.image_latents is not None
        return torch.where(self.mask.bool(), latents, self.image_latents)


def timestep_of(timesteps: torch.Tensor, masks: torch.Tensor | None) -> torch.Tensor:
    """The transformer's timestep for a batch: ``(batch,)`` without image-to-video rows (``masks`` None), else
    ``(batch, tokens)``, each row's ``t x (1 - mask)`` (a text row's mask is zeros: all ``t``)."""
    if masks is None:
        return timesteps
    return timesteps.unsqueeze(-1) * (1 - masks)


class LtxImageToVideo:
    """Mixin of the LTX-Video ``FamilyAdapter`` (listed before it): its rows may be image-to-video ones."""

    tasks: ClassVar[frozenset[Task]] = frozenset({Task.TEXT_TO_IMAGE, Task.IMAGE_TO_IMAGE})
    pipe: Any
    canvas: Any
    denoiser: Any
    num_frames: int

    if TYPE_CHECKING:  # the FamilyAdapter's (listed after the mixin)

        @property
        def device(self) -> torch.device: ...

        def latent_grid(self) -> tuple[int, int, int]: ...

    def conditioning_mask(self) -> torch.Tensor:
        """One image-to-video row's packed conditioning mask, ``(1, tokens)`` in float32: 1 on the first latent
        frame's tokens (``prepare_latents``)."""
        pipe = self.pipe
        frames, height, width = self.latent_grid()
        mask = torch.zeros((1, 1, frames, height, width), device=self.device, dtype=torch.float32)
        mask[:, :, 0] = 1.0
        packed: torch.Tensor = pipe._pack_latents(
            mask, pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size
        )
        return packed.squeeze(-1)

    def with_first_frame(self, halves: Sequence[dict[str, torch.Tensor]], rows: Sequence[Row]) -> None:
        """Each image-to-video row's halves (from its ``encode``) given its conditioning mask, in place."""
        for half, row in zip(halves, rows, strict=True):
            if row.task is Task.IMAGE_TO_IMAGE:
                half[CONDITIONING_MASK] = self.conditioning_mask()

    def collate(self, halves: Sequence[Any]) -> dict[str, torch.Tensor]:
        """The call's conditioning; where a half carries a conditioning mask, every half's (zeros for a text
        row's) concatenated under ``conditioning_mask``, else none."""
        masks = [half.get(CONDITIONING_MASK) for half in halves]
        names = [name for name in halves[0] if name != CONDITIONING_MASK]
        batch = {name: torch.cat([half[name] for half in halves]) for name in names}
        if any(mask is not None for mask in masks):
            zeros = torch.zeros_like(next(mask for mask in masks if mask is not None))
            batch[CONDITIONING_MASK] = torch.cat([zeros if mask is None else mask for mask in masks])
        return batch

    def begin(self, row: Row, scheduler: Any) -> int:
        """Every row runs its whole schedule (image-to-video has no strength)."""
        return 0

    def image_start(
        self, row: Row, scheduler: Any, begin: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, Inpainting | None]:
        """An image-to-video row's packed initial latents and its :class:`FirstFrame` (``prepare_latents`` of a
        batch of one, with the row's generator; ``dtype``: the prompt embeddings', which the image is encoded
        in)."""
        from diffusers.pipelines.ltx.pipeline_ltx_image2video import retrieve_latents
        from diffusers.utils.torch_utils import randn_tensor

        pipe, device = self.pipe, self.device
        height, width = self.canvas.height, self.canvas.width
        image = pipe.video_processor.preprocess(row.image, height=height, width=width)
        image = image.to(device=device, dtype=dtype)
        encoded = retrieve_latents(pipe.vae.encode(image[0].unsqueeze(0).unsqueeze(2)), row.generator)
        encoded = torch.cat([encoded], dim=0).to(torch.float32)
        encoded = pipe._normalize_latents(encoded, pipe.vae.latents_mean, pipe.vae.latents_std)
        frames, latent_height, latent_width = self.latent_grid()
        encoded = encoded.repeat(1, 1, frames, 1, 1)
        shape = (1, int(self.denoiser.config.in_channels), frames, latent_height, latent_width)
        mask = torch.zeros((1, 1, frames, latent_height, latent_width), device=device, dtype=torch.float32)
        mask[:, :, 0] = 1.0
        noise = randn_tensor(shape, generator=[row.generator], device=device, dtype=torch.float32)
        latents = encoded * mask + noise * (1 - mask)
        patch, patch_t = pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size
        packed = pipe._pack_latents(latents, patch, patch_t)
        denoised = 1 - pipe._pack_latents(mask, patch, patch_t)  # (1, tokens, 1): 0 on the first frame's tokens
        return packed, FirstFrame(packed, pipe._pack_latents(noise, patch, patch_t), denoised, None)
