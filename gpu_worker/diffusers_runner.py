"""The default runner: one diffusers pipeline, loaded once, called once per fused batch.

All specs of a batch share one compatibility key (size, frames, steps, guidance, n, negative-prompt presence, task,
strength, ...), so the batch maps onto a single pipeline call: one row per output image (a request's prompt,
negative prompt, input image and mask repeated ``n`` times), and every output gets its own generator seeded
``spec.seed + k``, which makes each row equal (to float rounding) to a solo run.

LoRA adapters are per row: a batch whose requests all have the same adapter and scale (or none) runs with it active
on the pipeline; one that mixes them runs each row with its own (``LoraActivator.mixed``, peft's per-row
``adapter_names``) in the same single call. Should a pipeline's layers not fit that (``LoraMixingError``), the
runner stops mixing and from then on runs such a batch as one call per adapter, outputs in request order.

What differs between pipeline families (their extra arguments, what they take, how many outputs per prompt they
call it, videos) is the family's (``gpu_worker.families``), chosen by the loaded pipeline's class. Image-to-image
and inpainting run on the same loaded weights: their pipelines are derived with diffusers' ``from_pipe`` (which
shares every component, so no second copy is in memory). A family without such a pipeline simply does not list
the task in ``tasks``.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import importlib
import inspect
import logging
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from gpu_worker import approximations
from gpu_worker.accelerations import attention, bucket, compile_denoiser, use_channels_last
from gpu_worker.batch_knee import KneeTable, measured_sizes
from gpu_worker.families import family_of
from gpu_worker.lora import LoraActivator, LoraMixingError
from gpu_worker.prompt_cache import PromptCache, install
from gpu_worker.runner import InputImages, Runner, StepCallback, StepSet, Video
from gpu_worker.step_engine import StepEngine, step_tasks, supports
from gpu_worker.step_engine.request_set import RequestSet
from gpu_worker.step_limit import largest_step_count
from gpu_worker.torch_env import make_generators, resolve_device, resolve_dtype
from shared.compat import StepKey, compat_key, pixel_cost
from shared.contracts import BatchKnee, LoraRef, ModelTraits, RequestSpec, Task
from shared.settings import Settings

DERIVED_PIPELINES: dict[Task, str] = {
    Task.IMAGE_TO_IMAGE: "AutoPipelineForImage2Image",
    Task.INPAINT: "AutoPipelineForInpainting",
}
"""The diffusers auto-pipeline that derives each image task's pipeline from the loaded one (``from_pipe``), for a
family that names none of its own (``PipelineFamily.derived_pipelines``)."""

log = logging.getLogger(__name__)

KNEE_SAVE_EVERY = 16
"""Live forwards between two writes of the batch knee table to disk."""


def pipeline_class(name: str) -> Any:
    """The pipeline class ``name`` names: a diffusers class, or ``"module:Class"``."""
    if ":" in name:
        module, _, attribute = name.partition(":")
        return getattr(importlib.import_module(module), attribute)
    import diffusers

    return getattr(diffusers, name)


def absent_components(source: str) -> dict[str, None]:
    """The components a saved pipeline left out (``[null, null]`` in its model_index.json, e.g. Stable Diffusion 3
    without its T5 encoder), as ``None`` keyword arguments: ``from_pretrained`` refuses to load them otherwise."""
    from diffusers import DiffusionPipeline

    try:
        index = DiffusionPipeline.load_config(source)
    except Exception:  # noqa: BLE001 - from_pretrained then reports what is wrong with the source
        return {}
    return {name: None for name, value in index.items() if value == [None, None] and not name.startswith("_")}


def check_batch(specs: Sequence[RequestSpec]) -> RequestSpec:
    """Return the first spec after checking that every spec shares its compatibility key (one pipeline call)."""
    if not specs:
        raise ValueError("empty batch")
    head = specs[0]
    key = compat_key(head)
    for spec in specs[1:]:
        other = compat_key(spec)
        if other != key:
            differs = next(f.name for f in dataclasses.fields(key) if getattr(key, f.name) != getattr(other, f.name))
            raise ValueError(f"request {spec.id} differs from {head.id} in {differs}: not one batch")
    return head


class DiffusersRunner(Runner):
    """A runner over a diffusers pipeline: ``settings.model`` (path or hub id) or the demo model."""

    def __init__(self, settings: Settings) -> None:
        from diffusers import DiffusionPipeline

        self.settings = settings
        if settings.torch_threads is not None:
            torch.set_num_threads(settings.torch_threads)
        self.device = resolve_device(settings.device)
        self.dtype = resolve_dtype(settings.torch_dtype, self.device)
        source = settings.model
        if not source:  # unset or empty (compose passes FUSEFLEET_MODEL through, empty by default)
            from demo_models import ensure_demo_model  # the demo only: a production worker never needs it

            source = str(ensure_demo_model(settings.model_cache_dir, settings.demo_family))
            log.warning(
                "serving the %s DEMO model: tiny, random weights, its images are noise (set FUSEFLEET_MODEL to a "
                "real diffusers pipeline)",
                settings.demo_family,
            )
        with warnings.catch_warnings():
            # Recent diffusers prefer `dtype=` (FutureWarning); `torch_dtype=` works on all supported ones.
            warnings.filterwarnings("ignore", message=".*torch_dtype.*", category=FutureWarning)
            pipe: Any = DiffusionPipeline.from_pretrained(  # type: ignore[no-untyped-call]
                source, torch_dtype=self.dtype, **absent_components(source)
            )
        if getattr(pipe, "safety_checker", None) is not None:
            pipe.safety_checker = None
        pipe.set_progress_bar_config(disable=True)
        self.pipe: Any = pipe.to(self.device)
        self.approximations = approximations.apply(
            self.pipe, settings.step_cache, settings.weight_quantization, self.device
        )
        """The approximate accelerations applied (``gpu_worker.approximations``; none by default)."""
        self.buckets = self._accelerate()
        """The batch buckets a forward's rows are padded to (a compiled denoiser); empty: no padding."""
        self.family = family_of(self.pipe)
        if self.family.traits.video and hasattr(getattr(self.pipe, "vae", None), "enable_slicing"):
            # a batch's videos are decoded one at a time (the same frames as a solo decode): its decode memory is
            # its largest video's, which the api bounds (max_video_decode_bytes)
            self.pipe.vae.enable_slicing()
        fused = settings.fused if settings.fused is not None else self.family.traits.fused
        self._traits: ModelTraits = self.family.traits.model_copy(
            update={
                "fused": fused,
                "lora": hasattr(self.pipe, "load_lora_weights"),
                # say once: its step-engine adapter's tasks (none where it runs request-level: ``step_mode``)
                "step_tasks": step_tasks(self.pipe) if self.step_mode else (),
                "max_inference_steps": largest_step_count(
                    getattr(self.pipe, "scheduler", None), settings.max_inference_steps
                ),
                "approximate": self.approximations.describe() if self.approximations.any else None,
            }
        )
        if not self.traits.fused:
            log.warning(
                "%s is not a pipeline family known to take prompt and generator lists: batches run request by "
                "request (FUSEFLEET_FUSED=true forces one forward per batch)",
                self.pipeline_name,
            )
        self.loras = LoraActivator(self.pipe, settings.lora_dir)
        self.lora_mixing = True
        """Whether a batch of several adapters runs as one call (False once the pipeline proved it cannot)."""
        loaded = {self.family.loaded_task: self.pipe} if self.family.loaded_task is not None else {}
        self._pipes: dict[Task, Any] = {**loaded, **self._derived_pipelines()}
        self._call_params = {
            task: frozenset(inspect.signature(derived.__call__).parameters) for task, derived in self._pipes.items()
        }
        self.prompt_cache = PromptCache(settings.prompt_cache_entries, int(settings.prompt_cache_mb * 2**20))
        """Each prompt encoded once (``gpu_worker.prompt_cache``), by every pipeline of this model; not while a
        LoRA adapter is active (it may change the text encoders)."""
        if settings.prompt_cache_entries:
            for pipeline in {id(p): p for p in [self.pipe, *self._pipes.values()]}.values():
                install(pipeline, self.prompt_cache, bypass=lambda: self.loras.active)
        self.knees = KneeTable(self._knee_path(source))
        """Seconds per step by request pixel cost and batch size of this model on this device: measured forwards,
        kept on disk across restarts (``gpu_worker.batch_knee``)."""
        self._unsaved_forwards = 0
        self._shapes_run: set[tuple[Task, int, int]] = set()
        """(task, pixel cost, rows with padding) of the forwards run so far: with a compiled denoiser the first of
        each compiles it, and is no measurement of its size."""
        if settings.batch_knee_warmup:
            self.measure_knees(settings.knee_warmup_sizes, measured_sizes(settings.max_num_seqs))

    def _accelerate(self) -> tuple[int, ...]:
        """Apply the exact accelerations the settings ask for (``gpu_worker.accelerations``); the buckets."""
        settings = self.settings
        if settings.channels_last if settings.channels_last is not None else self.device.type == "cuda":
            log.info("channels-last: %s", ", ".join(use_channels_last(self.pipe)) or "no convolutional component")
        if not settings.compile_denoiser:
            return ()
        cache = settings.compile_cache_dir or Path(settings.model_cache_dir) / "inductor"
        compiled = compile_denoiser(self.pipe, cache)
        buckets = measured_sizes(settings.max_num_seqs) if compiled else ()
        log.info("compiled %s (repeated blocks), batch buckets %s, cache %s", compiled, buckets, cache)
        return buckets

    def _pad(self, kwargs: dict[str, Any], rows: int) -> int:
        """With a compiled denoiser, pad the call's rows up to their bucket (one static shape each): each padding
        row repeats the last row's texts and inputs with a generator of its own. The number of rows added."""
        padding = bucket(rows, self.buckets) - rows if self.buckets else 0
        if padding <= 0:
            return 0
        for name in ("prompt", "negative_prompt", "image", "mask_image"):
            if isinstance(kwargs.get(name), list):
                kwargs[name] = kwargs[name] + [kwargs[name][-1]] * padding
        extra = [torch.Generator(device=self.device).manual_seed(0) for _ in range(padding)]
        kwargs["generator"] = list(kwargs["generator"]) + extra
        return padding

    def _knee_path(self, source: str) -> Path:
        """The knee table's file: one per model, device and dtype, in the model cache folder."""
        device = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else self.device.type
        digest = hashlib.sha256(f"{source}|{device}|{self.dtype}".encode()).hexdigest()[:16]
        return Path(self.settings.model_cache_dir) / "batch-knees" / f"{digest}.json"

    def measure_knees(self, shapes: Sequence[tuple[int, int]], sizes: Sequence[int], steps: int = 2) -> None:
        """Time a batch of each of ``sizes`` at each (width, height) of ``shapes`` not in the knee table yet (one
        forward of the smallest first, not counted: the first call of a shape pays its set-up), progress logged;
        the table saved. With a compiled denoiser every size is run once first (its bucket compiled, not counted),
        also at a shape already in the table: a restart compiles at start, not in its first live forwards. A family
        whose loaded pipeline needs an input image measures nothing here."""
        if self.family.loaded_task is None:
            return
        for width, height in shapes:
            probe = self._probe_specs(width, height, 1, steps)
            known = bool(self.knees.seconds(str(pixel_cost(probe[0]))))
            if known and not self.buckets:
                continue
            for size in sizes if self.buckets else sizes[:1]:  # warm-up: set-up (and compilation), not counted
                started = time.perf_counter()
                self._call(self._probe_specs(width, height, size, steps), lambda step, total: False, None)
                if self.buckets:
                    log.info(
                        "compiled %s for %d requests at %dx%d: %.1f s",
                        self.pipeline_name,
                        size,
                        width,
                        height,
                        time.perf_counter() - started,
                    )
            if known:
                continue
            log.info("measuring the batch knee of %s at %dx%d: batches of %s", self.pipeline_name, width, height, sizes)
            self.knees.clear(str(pixel_cost(probe[0])))
            for size in sizes:
                started = time.perf_counter()
                self._call(self._probe_specs(width, height, size, steps), lambda step, total: False, None)
                log.info("  %d requests: %.3f s", size, time.perf_counter() - started)
        self.knees.save()

    def _probe_specs(self, width: int, height: int, size: int, steps: int) -> list[RequestSpec]:
        """``size`` requests of the family's defaults at ``width`` x ``height`` (for timing only)."""
        multiple = self.traits.size_multiple
        width, height = max(multiple, width // multiple * multiple), max(multiple, height // multiple * multiple)
        video = {"num_frames": self.traits.frames_multiple + 1} if self.traits.video else {}
        return [
            RequestSpec(
                id=f"knee-{i}",
                model="knee",
                prompt=f"a measurement {i}",
                width=width,
                height=height,
                num_inference_steps=steps,
                seed=i,
                created_at=0.0,
                **video,
            )
            for i in range(size)
        ]

    def batch_knees(self, margin: float) -> tuple[BatchKnee, ...]:
        """The knee of every request pixel cost measured so far (what the worker announces); none where
        ``batch_knee_cap`` is off (unset: on a CUDA device only)."""
        cap = self.settings.batch_knee_cap
        if not (cap if cap is not None else self.device.type == "cuda"):
            return ()
        knees = self.knees.knees(margin)
        return tuple(
            BatchKnee(cost=int(cost), knee=size) for cost, size in sorted(knees.items(), key=lambda c: int(c[0]))
        )

    def _observe(self, specs: Sequence[RequestSpec], seconds: float, steps: int) -> None:
        """A forward of ``specs`` that ran ``steps`` steps in ``seconds``: into the knee table (saved now and then)."""
        self.knees.observe(str(pixel_cost(specs[0])), len(specs), seconds, steps)
        self._unsaved_forwards += 1
        if self._unsaved_forwards >= KNEE_SAVE_EVERY:
            self._unsaved_forwards = 0
            self.knees.save()

    def _derived_pipelines(self) -> dict[Task, Any]:
        """The image-task pipelines of the loaded family, sharing its components."""
        derived: dict[Task, Any] = {}
        for task, class_name in (self.family.derived_pipelines or DERIVED_PIPELINES).items():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    pipeline = pipeline_class(class_name).from_pipe(self.pipe)
            except Exception as exc:  # noqa: BLE001 - the family has no such pipeline: the task is not offered
                log.info("%s: no %s pipeline (%s: %s)", type(self.pipe).__name__, task, type(exc).__name__, exc)
                continue
            pipeline.set_progress_bar_config(disable=True)
            derived[task] = pipeline
        return derived

    @property
    def traits(self) -> ModelTraits:
        """The family's traits (what the worker announces), with whether this pipeline loads LoRA adapters;
        ``settings.fused``, when set, overrides fusing."""
        return self._traits

    @property
    def pipeline_name(self) -> str:
        """The loaded pipeline's class (what the worker announces)."""
        return type(self.pipe).__name__

    @property
    def tasks(self) -> frozenset[Task]:
        """Text-to-image (where the loaded pipeline runs it), plus image-to-image and inpainting where the family
        has those pipelines."""
        return frozenset(self._pipes)

    @property
    def fused(self) -> bool:
        """One forward per batch: the family takes prompt and generator lists (or ``settings.fused`` says so)."""
        return self.traits.fused

    @property
    def step_mode(self) -> bool:
        """Whether the loaded pipeline's family has a step-mode adapter (``gpu_worker.step_engine``) and no step
        cache, which follows one call's steps, not a set's (``gpu_worker.approximations``)."""
        return supports(self.pipe) and self.approximations.step_cache is None

    @property
    def fused_by_steps(self) -> bool:
        """Request-level batches run as closed step sets when the family has a step-mode adapter, so an aborted row
        leaves the forward at the next step (``gpu_worker.set_forward``)."""
        return self.step_mode

    def step_set(self, key: StepKey) -> StepSet:
        """An empty running set for the requests of ``key``, each row with its own LoRA adapter (the engine applies
        them per row through ``loras``); ValueError naming what step mode cannot run (an image task, video, true
        CFG)."""
        return RequestSet(StepEngine.for_key(self.pipe, key, self.loras), self.device)

    def release_memory(self) -> None:
        """Give cached accelerator memory back after an out-of-memory forward, before a smaller retry (the prompt
        cache's embeddings included: they are encoded again as needed)."""
        self.prompt_cache.clear()
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def run(
        self,
        specs: Sequence[RequestSpec],
        on_step: StepCallback,
        inputs: Mapping[str, InputImages] | None = None,
    ) -> list[list[Any]]:
        """Run ``specs`` in one pipeline call and return ``spec.n`` PIL images (videos, for a video family) per
        spec, in order. Each row gets its request's LoRA adapter (one call per adapter when this pipeline proved it
        cannot mix them: ``lora_mixing``).

        Image tasks take each request's input image (and mask) from ``inputs``, already of the output size.
        """
        head = check_batch(specs)
        if head.task not in self._pipes:
            raise ValueError(f"{type(self.pipe).__name__} has no {head.task} pipeline")
        loras = [spec.lora for spec in specs]
        if len(set(loras)) == 1:
            self.loras.activate(head.lora)
            return self._call(specs, on_step, inputs)
        if self.lora_mixing:
            try:
                with self.loras.mixed([spec.lora for spec in specs for _ in range(spec.n)]):
                    return self._call(specs, on_step, inputs)
            except LoraMixingError as exc:
                log.warning("%s cannot mix LoRA adapters (%s): one call per adapter", self.pipeline_name, exc)
                self.lora_mixing = False
        groups: dict[LoraRef | None, list[int]] = {}
        for i, spec in enumerate(specs):
            groups.setdefault(spec.lora, []).append(i)
        outputs: list[list[Any]] = [[] for _ in specs]
        for lora, members in groups.items():
            self.loras.activate(lora)
            for i, images in zip(members, self._call([specs[i] for i in members], on_step, inputs), strict=True):
                outputs[i] = images
        return outputs

    def _call(
        self, specs: Sequence[RequestSpec], on_step: StepCallback, inputs: Mapping[str, InputImages] | None
    ) -> list[list[Any]]:
        """One pipeline call over ``specs`` (of one compatibility key) with the adapters set up by the caller."""
        ran = [0]  # the last step reported: a forward stopped early (aborted) is not a measurement of its size

        def report(step: int, total: int) -> bool:
            ran[0] = max(ran[0], step)
            return on_step(step, total)

        head = specs[0]
        pipe = self._pipes[head.task]
        accepts = self._call_params[head.task]
        steps = head.num_inference_steps
        # One row per output (each prompt repeated n times, one output per prompt) rather than
        # num_images_per_prompt=n: the same call, and immune to pipelines that order the repeated rows of one input
        # differently (Sana's and Qwen-Image's prompt masks with n > 1, diffusers 0.42). Generators are per output.
        rows = [spec for spec in specs for _ in range(spec.n)]

        kwargs: dict[str, Any] = {
            "prompt": [spec.prompt for spec in rows],
            "generator": make_generators(specs, self.device),
            self.family.per_prompt_kwarg: 1,
            "num_inference_steps": steps,
            "guidance_scale": head.guidance_scale,
            "output_type": "pil",
        }
        if "width" in accepts:  # image-to-image pipelines take the size of their input image
            kwargs.update(width=head.width, height=head.height)
        if head.negative_prompt is not None:
            kwargs["negative_prompt"] = [spec.negative_prompt for spec in rows]
        if head.guidance_rescale and "guidance_rescale" in accepts:
            kwargs["guidance_rescale"] = head.guidance_rescale
        kwargs.update(self.family.call_kwargs(head, accepts))
        if head.task.needs_image:
            if inputs is None:
                raise ValueError(f"{head.task} needs the requests' input images")
            kwargs["image"] = [inputs[spec.id].image for spec in rows]
            if "strength" in accepts:  # image-to-video takes the image as its first frame, no strength
                kwargs["strength"] = head.strength
            if head.task is Task.INPAINT:
                kwargs["mask_image"] = [inputs[spec.id].mask for spec in rows]

        def step_end(pipe: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]) -> dict[str, Any]:
            # image tasks denoise only the last `strength` part of the schedule: report the steps really run
            if report(step + 1, getattr(pipe, "_num_timesteps", None) or steps):
                pipe._interrupt = True
            return callback_kwargs

        if "callback_on_step_end" in accepts:
            kwargs["callback_on_step_end"] = step_end
        elif "callback" in accepts:  # older pipelines (PixArt): progress only, no stop before the forward ends

            def legacy_step(step: int, timestep: Any, latents: Any) -> None:
                report(step + 1, steps)

            kwargs.update(callback=legacy_step, callback_steps=1)
        padding = self._pad(kwargs, len(rows))
        started = time.perf_counter()
        with attention(self.settings.sdpa_backend), self.approximations.call():
            result = pipe(**kwargs)
        elapsed = time.perf_counter() - started
        if "callback_on_step_end" not in accepts and "callback" not in accepts:
            report(steps, steps)
        shape = (head.task, pixel_cost(head), len(rows) + padding)
        first = bool(self.buckets) and shape not in self._shapes_run
        self._shapes_run.add(shape)
        complete = ran[0] >= (getattr(pipe, "_num_timesteps", None) or steps) and not getattr(pipe, "_interrupt", False)
        if complete and not first:
            self._observe(specs, elapsed, ran[0])
        outputs: list[Any] = (
            list(result.images)
            if not self.traits.video
            else [Video(frames=list(frames), fps=self.family.fps(head)) for frames in result.frames]
        )
        if padding and len(outputs) == len(rows) + padding:
            outputs = outputs[: len(rows)]  # the padding rows' outputs: dropped here, never in a result
        expected = len(specs) * head.n
        if len(outputs) != expected:
            raise RuntimeError(f"pipeline returned {len(outputs)} outputs, expected {expected}")
        return [outputs[i * head.n : (i + 1) * head.n] for i in range(len(specs))]
