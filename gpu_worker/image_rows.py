"""Row-wise image conditioning for diffusers' Wan image-to-video pipeline, so one call fuses requests that each
bring their own first frame.

diffusers' ``WanImageToVideoPipeline`` takes one image per call: ``check_inputs`` refuses a list, and
``prepare_latents`` encodes the image once and repeats it (or, with a generator list, encodes the whole batch once
per generator), so a batch of B images would get B x B conditions. :class:`WanImageRowsPipeline` is that pipeline
with those two steps per row: ``image`` may be a list with one image per row of the call (the prompt list's
length), and each row's noise (its own generator) and condition (its own image through the VAE) are made exactly as
its solo call makes them, then stacked; the denoising loop, the guidance and the decode are diffusers' own, over
the stacked rows. One image (or a batch of one) runs diffusers' code unchanged.

Wan 2.1's CLIP image embeddings (a transformer with ``image_dim``) are computed once per call and repeated to every
row by the pipeline's ``__call__``, so such a model takes one image per call: more than one is a ``ValueError``
(the batch's requests are then re-run one by one, ``gpu_worker.bisection``). Wan 2.2's image-to-video (no image
encoder) and its TI2V's ``expand_timesteps`` fuse.

``PipelineFamily.derived_pipelines`` names it (``"gpu_worker.image_rows:WanImageRowsPipeline"``); the runner derives
it from the loaded pipeline with ``from_pipe`` (the same components, its config carried over).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from diffusers.pipelines.wan.pipeline_wan_i2v import WanImageToVideoPipeline


def _rows(image: Any) -> list[Any]:
    return list(image) if isinstance(image, Sequence) and not isinstance(image, str) else [image]


class WanImageRowsPipeline(WanImageToVideoPipeline):
    """``WanImageToVideoPipeline`` whose ``image`` is one image per row (a list) or one for the call."""

    def check_inputs(self, prompt: Any, negative_prompt: Any, image: Any, *args: Any, **kwargs: Any) -> None:
        """diffusers' checks, of every row's image."""
        for one in _rows(image):
            super().check_inputs(prompt, negative_prompt, one, *args, **kwargs)  # type: ignore[no-untyped-call]

    def encode_image(self, image: Any, device: torch.device | None = None) -> torch.Tensor:
        """Wan 2.1's CLIP embeddings of the call's one image; several are refused (the call repeats one)."""
        if len(_rows(image)) > 1:
            raise ValueError(
                "this Wan image-to-video model conditions on CLIP image embeddings, which the pipeline shares across "
                "a call: one image per call"
            )
        return super().encode_image(image, device)  # type: ignore[no-any-return]

    def prepare_latents(
        self,
        image: Any,
        batch_size: int,
        num_channels_latents: int = 16,
        height: int = 480,
        width: int = 832,
        num_frames: int = 81,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        last_image: torch.Tensor | None = None,
    ) -> Any:
        """Each row's noise and condition as its solo call makes them (its image, its generator), stacked."""
        shape = (num_channels_latents, height, width, num_frames, dtype, device)
        if image.shape[0] == 1:
            return super().prepare_latents(image, batch_size, *shape, generator, latents, last_image)
        if image.shape[0] != batch_size:
            raise ValueError(f"{image.shape[0]} images for {batch_size} rows: give one image per row, or one")
        if last_image is not None:
            raise ValueError("a last frame is not taken with one image per row")
        parts: list[Any] = [
            super(WanImageRowsPipeline, self).prepare_latents(
                image[row : row + 1],
                1,
                *shape,
                [generator[row]] if isinstance(generator, list) else generator,
                latents[row : row + 1] if latents is not None else None,
            )
            for row in range(batch_size)
        ]
        noise = torch.cat([part[0] for part in parts])
        condition = torch.cat([part[1] for part in parts])
        if self.config.get("expand_timesteps"):  # and the first-frame mask, the same for every row
            return noise, condition, parts[0][2]
        return noise, condition
