"""The img2img and inpaint siblings of a tiny pipeline, checked as the tiny-family tests check them: diffusers'
``AutoPipelineForImage2Image`` / ``AutoPipelineForInpainting.from_pipe`` give the expected classes, and each runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def assert_siblings_run(
    pipe: Any,
    img2img: str,
    inpaint: str,
    *,
    image: Any,
    mask: Any,
    size: int,
    generator: Callable[[], Any],
    **call: Any,
) -> None:
    """``from_pipe(pipe)`` of each auto pipeline is of class ``img2img`` / ``inpaint`` and turns ``image`` (and
    ``mask``, for inpainting) into one ``size`` x ``size`` image for "a cat"; ``generator()`` makes each call's
    generator(s), ``call`` holds its other arguments."""
    from diffusers import AutoPipelineForImage2Image, AutoPipelineForInpainting

    for auto, expected, extra in (
        (AutoPipelineForImage2Image, img2img, {}),
        (AutoPipelineForInpainting, inpaint, {"mask_image": mask}),
    ):
        sibling = auto.from_pipe(pipe)
        sibling.set_progress_bar_config(disable=True)
        assert type(sibling).__name__ == expected
        out = sibling(
            prompt="a cat", image=image, height=size, width=size, generator=generator(), **extra, **call
        ).images
        assert [im.size for im in out] == [(size, size)]
