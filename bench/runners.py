"""Runners for benchmarks, pluggable by import path like any runner (``FUSEFLEET_RUNNER``).

- ``NullRunner`` does no work: it measures the fleet's own overhead (API, Redis, scheduler, Celery).
- ``SimulatedGpuRunner`` sleeps for a cost model t(B) = a + b*B (``FUSEFLEET_SIM_BASE_MS``,
  ``FUSEFLEET_SIM_PER_IMAGE_MS``; with ``FUSEFLEET_SIM_REF_SIDE`` each image weighs its area) and returns
  placeholder images, so batching and scale-out behave as on a GPU (the time is spent off the CPU). The cost
  model, the sleeping and the images are ``bench.peers.simulated_gpu``'s, shared with the peer servers. Every
  figure it produces must be labelled *simulated*. With ``FUSEFLEET_SIM_REF_STEPS=20`` a forward of S steps costs
  (a + b*B) * S / 20 (unset: a + b*B whatever its steps). With
  ``FUSEFLEET_SIM_TRACE=path`` it appends one JSON line per forward
  (``start``, ``end``: wall-clock seconds; ``images``) to that file, for ``bench.gap``. These variables are the
  benchmark's, not the fleet's: ``SimulatedGpuSettings`` reads them, ``shared.settings.Settings`` knows none.
- With ``FUSEFLEET_SIM_LOAD_MS`` (default 0: none) constructing a ``SimulatedGpuRunner`` sleeps that long: a model
  load. The worker builds one runner per model it loads (``gpu_worker.residency``: at start, and on demand after an
  eviction), so a fleet of several models pays it on every load, and the eviction drops the runner (it holds no
  memory to free). ``bench.multimodel`` uses it.
- It also runs step mode (the ``step_mode`` and ``step_set`` hooks of ``gpu_worker.runner.Runner``): a
  ``SimulatedStepSet`` sleeps ``(a + b*R) / 20`` per step of R rows (``CostModel.step_s``), each request leaving
  after its own number of steps, and traces one line per step (``rows``, ``finished``) to the same file.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from PIL import Image
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from bench.peers.simulated_gpu import (
    CostModel,
    placeholder_image,
    record_forward,
    record_step,
    sleep_forward,
)
from gpu_worker.runner import InputImages, Runner, StepCallback
from shared.compat import StepKey, step_key
from shared.contracts import ModelTraits, RequestSpec, Task
from shared.settings import ENV_PREFIX, Settings


class SimulatedGpuSettings(BaseSettings):
    """The simulated GPU's cost model and trace file, read from the ``FUSEFLEET_SIM_*`` variables that
    ``bench.peers.simulated_gpu`` names and explains (``CostModel.env`` writes them for every server of a benchmark);
    an empty ``FUSEFLEET_SIM_REF_SIDE`` or ``FUSEFLEET_SIM_REF_STEPS`` is 0."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

    sim_base_ms: float = Field(50.0, ge=0)
    sim_per_image_ms: float = Field(10.0, ge=0)
    sim_ref_side: int = 0
    sim_ref_steps: int = 0
    sim_trace: str | None = None
    sim_load_ms: float = Field(0.0, ge=0)

    @field_validator("sim_ref_side", "sim_ref_steps", mode="before")
    @classmethod
    def _empty_is_zero(cls, value: object) -> object:
        return 0 if value == "" else value

    @property
    def cost(self) -> CostModel:
        """The cost model these variables set."""
        return CostModel(self.sim_base_ms, self.sim_per_image_ms, self.sim_ref_side, self.sim_ref_steps)


def placeholder_images(specs: Sequence[RequestSpec]) -> list[list[Image.Image]]:
    """One small grey image per requested output (``simulated_gpu.placeholder_image``)."""
    return [[placeholder_image(spec.width, spec.height)] * spec.n for spec in specs]


class NullRunner(Runner):
    """Returns placeholder images at once: the end-to-end cost of a request is fusefleet's alone."""

    fused = True

    def __init__(self, settings: Settings) -> None:
        """Constructed with the fleet's settings, as every runner is; it needs none of them."""

    def run(
        self, specs: Sequence[RequestSpec], on_step: StepCallback, inputs: Mapping[str, InputImages] | None = None
    ) -> list[list[Image.Image]]:
        return placeholder_images(specs)


IMAGE_TASKS = frozenset({Task.TEXT_TO_IMAGE, Task.IMAGE_TO_IMAGE})


class SimulatedGpuRunner(Runner):
    """Sleeps a + b*B milliseconds per forward (B = output images, each weighted by its area when
    ``FUSEFLEET_SIM_REF_SIDE`` is set; times S / ref_steps when ``FUSEFLEET_SIM_REF_STEPS`` is), reporting each
    step; no CPU work. In step mode, its running sets are ``SimulatedStepSet``s on the same cost model."""

    fused = True
    step_mode = True

    def __init__(self, settings: Settings, simulated: SimulatedGpuSettings | None = None) -> None:
        """``simulated`` defaults to ``SimulatedGpuSettings()`` (the environment); ``settings`` is the fleet's."""
        simulated = simulated if simulated is not None else SimulatedGpuSettings()
        self.cost = simulated.cost
        self.trace = simulated.sim_trace
        if simulated.sim_load_ms > 0:  # a model load (FUSEFLEET_SIM_LOAD_MS), off the CPU as a copy to the GPU is
            time.sleep(simulated.sim_load_ms / 1000)

    def cost_s(self, images: int) -> float:
        """Seconds of a forward of ``images`` images of the reference size (``self.cost.forward_s`` weighs each
        image by its size)."""
        return self.cost.forward_s([(self.cost.ref_side, self.cost.ref_side)] * images)

    def run(
        self, specs: Sequence[RequestSpec], on_step: StepCallback, inputs: Mapping[str, InputImages] | None = None
    ) -> list[list[Image.Image]]:
        started = time.time()
        images = sum(spec.n for spec in specs)
        steps = denoising_steps(specs[0])  # one compatibility key: one step count (and strength)
        seconds = self.cost.forward_s(((spec.width, spec.height) for spec in specs for _ in range(spec.n)), steps)
        sleep_forward(seconds, steps, on_step)
        record_forward(self.trace, started, images)
        return placeholder_images(specs)

    @property
    def tasks(self) -> frozenset[Task]:
        """Text-to-image and image-to-image (a mixed workload's; the input image is not looked at)."""
        return IMAGE_TASKS

    @property
    def traits(self) -> ModelTraits:
        """The default traits; its step rows carry their task and strength, as Stable Diffusion's do
        (``ModelTraits.step_tasks``): both tasks share one step key."""
        return super().traits.model_copy(update={"step_tasks": tuple(task for task in Task if task in self.tasks)})

    def step_set(self, key: StepKey) -> SimulatedStepSet:
        """An empty running set for the requests of ``key``; ValueError naming the field for what the step engine
        does not run either (``StepEngine.for_key``): video; image-to-image runs from its start step (strength)."""
        if key.task is not None and key.task not in self.tasks:  # None: each row's own
            raise ValueError(f"task: the simulated GPU does not run {key.task}")
        for name in ("num_frames",):
            if getattr(key, name) is not None:
                raise ValueError(f"{name}: not taken in step mode")
        return SimulatedStepSet(self.cost, key, self.trace, step_tasks=self.traits.step_tasks)


def denoising_steps(spec: RequestSpec) -> int:
    """The denoiser calls a request takes: its steps, times its strength for an image task (a diffusers
    image-to-image pipeline starts ``int(steps * strength)`` steps before the end)."""
    if spec.task is Task.TEXT_TO_IMAGE or spec.strength is None:
        return spec.num_inference_steps
    return max(1, min(int(spec.num_inference_steps * spec.strength), spec.num_inference_steps))


@dataclass(slots=True, eq=False)
class _LiveRequest:
    """A request in a simulated running set: ``n`` rows that step together, ``done`` of ``total`` steps."""

    spec: RequestSpec
    done: int = 0

    @property
    def total(self) -> int:
        return denoising_steps(self.spec)

    @property
    def sizes(self) -> list[tuple[int, int]]:
        """One (width, height) per row (output image)."""
        return [(self.spec.width, self.spec.height)] * self.spec.n


class SimulatedStepSet:
    """A running set on the simulated GPU (``gpu_worker.runner.StepSet``): each ``step`` sleeps, off the CPU, what
    one step of the live rows costs (``CostModel.step_s``: ``(a + b * rows) / 20``), then advances every request it
    stepped by one; a request whose count reaches its ``num_inference_steps`` is finished and leaves the set, and
    ``outputs`` gives its ``n`` placeholder images. Requests join between steps with their own step counts and
    guidance, as in the step engine, and an abort drops a request before the next step (one aborted while a step
    sleeps is stepped but never returned).

    Threads: ``join``, ``step`` and ``outputs`` belong to the worker's loop; ``abort``, ``progress`` and
    ``requests`` may be called from any thread (a lock guards the dictionaries, never held while sleeping).
    ``sleep`` is the clock's (``time.sleep``); a test may pass another to see the seconds without waiting.
    """

    def __init__(
        self,
        cost: CostModel,
        key: StepKey,
        trace: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
        step_tasks: Collection[Task] = (),
    ) -> None:
        self.cost = cost
        self.key = key
        self.step_tasks = step_tasks  # the tasks its rows carry (``shared.compat.step_key``)
        self._trace = trace
        self._sleep = sleep
        self._lock = threading.Lock()
        self._live: dict[str, _LiveRequest] = {}  # joining order
        self._finished: dict[str, _LiveRequest] = {}  # left the set, outputs not taken yet

    def join(
        self, specs: Sequence[RequestSpec], inputs: Mapping[str, InputImages] | None = None
    ) -> dict[str, str]:
        """Add the requests (their ``inputs`` are not looked at); they take their first step at the next
        ``step``. ``{request id: why}`` for those refused (a duplicate, another step key, steps < 1, a guidance the
        engine refuses)."""
        refused: dict[str, str] = {}
        with self._lock:
            for spec in specs:
                why = self._refusal(spec)
                if why:
                    refused[spec.id] = why
                else:
                    self._live[spec.id] = _LiveRequest(spec)
        return refused

    def _refusal(self, spec: RequestSpec) -> str | None:
        if spec.id in self._live or spec.id in self._finished:
            return f"request {spec.id} is already in the running set"
        if step_key(spec, self.step_tasks) != self.key:
            return "step key: the request does not belong to this running set"
        if spec.num_inference_steps < 1:
            return f"num_inference_steps must be >= 1, got {spec.num_inference_steps}"
        if spec.n < 1:
            return f"n must be >= 1, got {spec.n}"
        if not math.isfinite(spec.guidance_scale):
            return f"guidance_scale must be finite, got {spec.guidance_scale}"
        if not 0.0 <= spec.guidance_rescale <= 1.0:
            return f"guidance_rescale must be in [0, 1], got {spec.guidance_rescale}"
        return None

    def step_cost_s(self, only: Collection[str] | None = None) -> float:
        """Seconds the next ``step(only)`` will sleep: one step of the rows of the live requests it steps."""
        with self._lock:
            stepping = self._stepping(only)
        return self.cost.step_s(size for request in stepping for size in request.sizes)

    def _stepping(self, only: Collection[str] | None) -> list[_LiveRequest]:
        return [request for rid, request in self._live.items() if only is None or rid in only]

    def step(self, only: Collection[str] | None = None) -> list[str]:
        """One step of every live request (or of those ``only`` names): sleeps its cost, then the ids of the
        requests it finished, in joining order. Nothing live: returns at once."""
        with self._lock:
            stepping = self._stepping(only)
        if not stepping:
            return []
        started = time.time()
        self._sleep(self.cost.step_s(size for request in stepping for size in request.sizes))
        finished: list[_LiveRequest] = []
        with self._lock:
            for request in stepping:
                rid = request.spec.id
                if self._live.get(rid) is not request:  # aborted while the step ran
                    continue
                request.done += 1
                if request.done >= request.total:
                    self._finished[rid] = self._live.pop(rid)
                    finished.append(request)
        rows = sum(request.spec.n for request in stepping)
        record_step(self._trace, started, rows, sum(request.spec.n for request in finished))
        return [request.spec.id for request in finished]

    def outputs(self, request_ids: Sequence[str]) -> list[list[Image.Image]]:
        """The ``n`` placeholder images of each finished request, in order; they leave the set. KeyError for an
        id that has not finished here (or whose outputs were taken)."""
        with self._lock:
            missing = [rid for rid in request_ids if rid not in self._finished]
            if missing:
                raise KeyError(f"not finished in this running set: {', '.join(missing)}")
            done = [self._finished.pop(rid).spec for rid in request_ids]
        return placeholder_images(done)

    def abort(self, request_id: str) -> bool:
        """Drop the request before the next step; False when it is not live (unknown, finished or aborted)."""
        with self._lock:
            return self._live.pop(request_id, None) is not None

    def progress(self) -> dict[str, tuple[int, int]]:
        """Live request id -> (steps done, of its total)."""
        with self._lock:
            return {rid: (request.done, request.total) for rid, request in self._live.items()}

    @property
    def requests(self) -> tuple[str, ...]:
        """The live requests, in joining order."""
        with self._lock:
            return tuple(self._live)
