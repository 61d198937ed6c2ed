"""Test runners built on the real diffusers runner (they import torch; see ``tests.support.runners``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from PIL import Image

from gpu_worker.diffusers_runner import DiffusersRunner
from gpu_worker.runner import InputImages, StepCallback, StepSet
from shared.compat import StepKey
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

    def step_set(self, key: StepKey) -> StepSet:
        return ExplodingSet(super().step_set(key))


class ExplodingSet:
    """A real step set whose steps raise, as the pipeline of ``ExplodingRunner`` does, while a request with
    ``explode`` in its prompt is among the requests stepped; everything else is ``inner``'s."""

    def __init__(self, inner: StepSet) -> None:
        self.inner = inner
        self.marked: set[str] = set()

    def join(
        self, specs: Sequence[RequestSpec], inputs: Mapping[str, InputImages] | None = None
    ) -> dict[str, str]:
        self.marked |= {spec.id for spec in specs if EXPLODE_MARKER in spec.prompt}
        return self.inner.join(specs, inputs)

    def step(self, only: Collection[str] | None = None) -> list[str]:
        stepped = self.inner.requests if only is None else tuple(only)
        culprits = [rid for rid in stepped if rid in self.marked]
        if culprits:
            raise ValueError(f"prompt of request {culprits[0]} asked the pipeline to explode")
        return self.inner.step(only)

    def outputs(self, request_ids: Sequence[str]) -> list[list[Image.Image]]:
        return self.inner.outputs(request_ids)

    def abort(self, request_id: str) -> bool:
        return self.inner.abort(request_id)

    def progress(self) -> dict[str, tuple[int, int]]:
        return self.inner.progress()

    @property
    def requests(self) -> tuple[str, ...]:
        return self.inner.requests
