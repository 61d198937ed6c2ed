"""Test runners built on the real diffusers runner (they import torch; see ``tests.support.runners``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from PIL import Image

from gpu_worker.diffusers_runner import DiffusersRunner
from gpu_worker.runner import InputImages, StepCallback
from shared.contracts import RequestSpec
from tests.support.runners import EXPLODE_MARKER


class ExplodingRunner(DiffusersRunner):
    """The real diffusers runner, except that a forward containing a prompt with ``explode`` raises."""

    def run(
        self,
        specs: Sequence[RequestSpec],
        on_step: StepCallback,
        inputs: Mapping[str, InputImages] | None = None,
    ) -> list[list[Image.Image]]:
        culprits = [spec.id for spec in specs if EXPLODE_MARKER in spec.prompt]
        if culprits:
            raise ValueError(f"prompt of request {culprits[0]} asked the pipeline to explode")
        return super().run(specs, on_step, inputs)
