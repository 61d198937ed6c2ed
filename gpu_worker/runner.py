"""The runner contract: what the worker asks of whatever turns a batch of requests into images.

A runner subclasses ``Runner``: ``fused`` and ``run`` are its own, every other hook has a documented default, so the
worker calls hooks and never probes for them. It is loaded by import path (``FUSEFLEET_RUNNER=module:Class``),
constructed once per worker process with the settings, and then called once per batch (fused) or once per request
(not fused). A worker serving several models (``FUSEFLEET_MODELS``) constructs one runner per model, each with that
model's settings (``Settings.for_model``), and may drop one and construct it again later (``gpu_worker.residency``).
Custom pipelines and test runners plug in here without touching the worker.

What the runner's model takes (size multiple, negative prompts, true CFG, video...) is its ``traits``
(``shared.contracts.ModelTraits``): the worker announces them and the api refuses what the model cannot do.
Image-conditioned tasks are a capability: a runner that can do them lists them in ``tasks`` and takes the ``inputs``
of ``run`` (each request's input image and mask); the worker fails requests for a task its runner does not list,
with a clear error, and never calls it.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from PIL import Image

from shared.compat import StepKey
from shared.contracts import ModelTraits, RequestSpec, Task
from shared.settings import Settings

StepCallback = Callable[[int, int], bool]
"""Called after denoising step ``step`` of ``total`` (1-based); returns True when the forward should stop."""


TEXT_ONLY: frozenset[Task] = frozenset({Task.TEXT_TO_IMAGE})


@dataclass(frozen=True, slots=True)
class Video:
    """One generated video: its frames, in order, and its frame rate. A runner whose ``traits.video`` is set
    returns ``spec.n`` of these per request instead of images."""

    frames: Sequence[Image.Image]
    fps: float


def video_frames(spec: RequestSpec, traits: ModelTraits) -> int | None:
    """Frames per video of ``spec`` on a model with ``traits`` (its own or the family's default); None for an
    image model."""
    if not traits.video:
        return None
    return spec.num_frames or traits.default_frames


@dataclass(frozen=True, slots=True)
class InputImages:
    """What an image-conditioned request is conditioned on, decoded: RGB image and, for inpainting, an 8-bit mask
    (white = repaint), both already of the request's output size."""

    image: Image.Image
    mask: Image.Image | None = None


class StepSet(Protocol):
    """A running set of requests on one step key (step mode, ``docs/step_mode.md``): each ``step`` is one fused
    denoiser call over the rows of every live request, each request at its own step with its own steps, guidance and
    generators. Requests join between steps and leave when their last row is done (or aborted).

    Threads: ``join``, ``step`` and ``outputs`` belong to the worker's loop; ``abort``, ``progress`` and ``requests``
    may be called from any thread.
    """

    def join(
        self, specs: Sequence[RequestSpec], inputs: Mapping[str, InputImages] | None = None
    ) -> dict[str, str]:
        """Add the requests' rows; they take their first step at the next ``step`` (prompts encoded together).
        ``inputs``: each image-task request's input image (and mask), by request id. Returns ``{request id: why}``
        for the requests refused (nothing of them joined; the others did)."""
        ...

    def step(self, only: Collection[str] | None = None) -> list[str]:
        """One denoising step of every live request (or of the request ids ``only`` names) in one fused call;
        the ids of the requests this step finished (every row done), whose outputs ``outputs`` then gives.
        Raises what the denoiser raises, with every request left as it was before the step."""
        ...

    def outputs(self, request_ids: Sequence[str]) -> list[list[Image.Image]]:
        """The ``spec.n`` images of each finished request (decoded together), in order; they leave the set."""
        ...

    def abort(self, request_id: str) -> bool:
        """Drop the request's rows before the next step; False when it is not live."""
        ...

    def progress(self) -> dict[str, tuple[int, int]]:
        """Live request id -> (denoiser calls done, of total)."""
        ...

    @property
    def requests(self) -> tuple[str, ...]:
        """The live requests, in joining order."""
        ...


class Runner(ABC):
    """Turns compatible requests into images. ``fused`` and ``run`` are abstract; every other hook has the default
    its docstring gives. A subclass overrides a hook with a property, a method or a class attribute."""

    @property
    @abstractmethod
    def fused(self) -> bool:
        """True when ``run`` accepts several requests in one forward; else it is called with one at a time."""

    @abstractmethod
    def run(
        self, specs: Sequence[RequestSpec], on_step: StepCallback, inputs: Mapping[str, InputImages] | None = None
    ) -> list[list[Image.Image]]:
        """Run ``specs`` (all sharing one compatibility key, which leaves out the LoRA: their adapters and scales may
        differ, and a runner that cannot mix them in one call splits the batch itself) and return ``spec.n`` images
        per spec, in order.

        Raises whatever the pipeline raises; the worker then isolates the failing request. ``inputs`` (each request
        id's ``InputImages``) is passed, by keyword, only for the image tasks the runner lists in ``tasks``; a
        text-to-image forward is called as ``run(specs, on_step)``.
        """

    @property
    def traits(self) -> ModelTraits:
        """What the model takes (the worker announces it). Default: permissive traits, family the class's name,
        ``fused`` as the runner says."""
        return ModelTraits(family=type(self).__name__, fused=self.fused)

    @property
    def tasks(self) -> frozenset[Task]:
        """The tasks ``run`` does. Default: text-to-image only."""
        return TEXT_ONLY

    @property
    def pipeline_name(self) -> str:
        """The pipeline the worker announces. Default: the class's name."""
        return type(self).__name__

    @property
    def step_mode(self) -> bool:
        """Whether the loaded model can run step mode (``step_set``). Default: False."""
        return False

    @property
    def fused_by_steps(self) -> bool:
        """Whether a request-level batch runs as a closed step set (``gpu_worker.set_forward``), so that an aborted
        row leaves it at the next step. Default: False."""
        return False

    def step_set(self, key: StepKey) -> StepSet:
        """An empty running set for the requests of ``key``; ValueError naming what it cannot run (the worker then
        runs them request-level). Default: ValueError, no step mode."""
        raise ValueError(f"{type(self).__name__} does not run step mode")

    def release_memory(self) -> None:  # noqa: B027 - a hook whose default does nothing
        """Give cached accelerator memory back after an out-of-memory forward, before a smaller retry. Default:
        nothing to give back."""


def load_runner(settings: Settings) -> Runner:
    """Import ``settings.runner`` ('module:Class' or 'module.Class') and construct it with ``settings``."""
    path = settings.runner
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"FUSEFLEET_RUNNER must look like 'package.module:Class', got {path!r}")
    factory = getattr(importlib.import_module(module_name), attr)
    runner = factory(settings)
    if not isinstance(runner, Runner):
        raise TypeError(f"{path} is not a gpu_worker.runner.Runner: a runner subclasses it (fused, run)")
    return runner
