"""The step engine: a denoising loop over a set of rows that changes between steps.

Each :meth:`StepEngine.step` is **one** fused denoiser call over every live row, with a timestep per row; each row
keeps its own scheduler (a fresh copy of the pipeline's, with its own step count), latents, generator, guidance
scale and step index. Rows join between steps (:meth:`StepEngine.join`: their prompts encoded and their latents
drawn in one batch), finished rows leave at the step that finishes them (returned by ``step``, decoded together by
:meth:`StepEngine.decode`), and an aborted row leaves before the next step (:meth:`StepEngine.abort`): its latents,
its half of the guidance embeddings, its generator and its scheduler go with it, and its peers go on unchanged.

Threads: ``join``, ``step`` and ``decode`` belong to one loop thread; ``abort``, ``abort_request``, ``progress``
and ``live`` may be called from any thread (a row aborted while a step runs is computed in that step but never
returned). A denoiser call that raises leaves every row as it was before the step: the caller may retry it,
step a subset (``only``) to isolate a culprit, or abort the rows.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gpu_worker.families import family_of
from gpu_worker.lora import LoraMixingError
from gpu_worker.step_engine.adapter import Canvas, Conditioning, FamilyAdapter, Prompt
from gpu_worker.step_engine.flux import FluxAdapter
from gpu_worker.step_engine.image_task import Inpainting
from gpu_worker.step_engine.ltx_video import LtxVideoAdapter
from gpu_worker.step_engine.pixart import PixArtAdapter
from gpu_worker.step_engine.qwen_image import QwenImageAdapter
from gpu_worker.step_engine.rows import Finished, Row, RowProgress
from gpu_worker.step_engine.sana import SanaAdapter
from gpu_worker.step_engine.stable_diffusion import StableDiffusionAdapter
from gpu_worker.step_engine.stable_diffusion_3 import StableDiffusion3Adapter
from gpu_worker.step_engine.stable_diffusion_xl import StableDiffusionXLAdapter
from shared.compat import StepKey
from shared.contracts import LoraRef, Task

if TYPE_CHECKING:
    from gpu_worker.lora import LoraActivator

log = logging.getLogger(__name__)

ADAPTERS: Mapping[str, type[FamilyAdapter]] = {
    adapter.family: adapter
    for adapter in (
        StableDiffusionAdapter,
        StableDiffusionXLAdapter,
        StableDiffusion3Adapter,
        PixArtAdapter,
        FluxAdapter,
        SanaAdapter,
        QwenImageAdapter,
        LtxVideoAdapter,
    )
}
"""Family name (``gpu_worker.families``) -> its step-mode adapter; every other family runs request-level."""


class UnsupportedPipeline(ValueError):
    """The pipeline's family has no step-mode adapter (it keeps request-level batching)."""


def supports(pipe: Any) -> bool:
    """Whether ``pipe``'s family can run in step mode."""
    return family_of(pipe).name in ADAPTERS


def step_tasks(pipe: Any) -> tuple[Task, ...]:
    """The tasks a step row of ``pipe``'s family carries itself (its adapter's ``tasks``, in ``Task`` order; none
    without step mode): what the worker announces as ``ModelTraits.step_tasks``."""
    tasks = ADAPTERS[family_of(pipe).name].tasks if supports(pipe) else frozenset()
    return tuple(task for task in Task if task in tasks)


@dataclass(slots=True, eq=False)
class _LiveRow:
    """A row in the running set: its own scheduler, latents, encoded prompt and step index; an image row also its
    first timestep's index (``begin``, from its strength) and, inpainting, its condition."""

    row: Row
    scheduler: Any
    latents: torch.Tensor
    prompt: Prompt
    index: int = 0
    begin: int = 0
    inpainting: Inpainting | None = None

    @property
    def total(self) -> int:
        """Denoiser calls the row needs: one per entry of its scheduler's timesteps from ``begin`` on."""
        return len(self.scheduler.timesteps) - self.begin

    @property
    def timestep(self) -> torch.Tensor:
        """The row's timestep at its next step."""
        timestep: torch.Tensor = self.scheduler.timesteps[self.begin + self.index]
        return timestep

    @property
    def next_timestep(self) -> torch.Tensor | None:
        """The row's timestep after its next step (None: its next step is its last)."""
        after = self.begin + self.index + 1
        return self.scheduler.timesteps[after] if after < len(self.scheduler.timesteps) else None

    def scale_model_input(self) -> torch.Tensor:
        """The row's denoiser input at its timestep (the scheduler's input scaling, where it has one; an
        inpainting row's mask and masked latents where its denoiser takes them)."""
        scaled: torch.Tensor = self.latents
        if hasattr(self.scheduler, "scale_model_input"):
            scaled = self.scheduler.scale_model_input(self.latents, self.timestep)
        return scaled if self.inpainting is None else self.inpainting.model_input(scaled)

    def progress(self) -> RowProgress:
        return RowProgress(self.row.id, self.row.request_id, self.index, self.total)


class StepEngine:
    """Step-level denoising over a changing set of rows on one loaded diffusers pipeline.

    Every row shares the canvas (size, prompt sequence length) and whatever is set on the pipeline (its
    scheduler type and config, an active LoRA): the step key's part. Rows differ in prompt, negative prompt,
    steps, guidance scale and rescale, and generator.
    """

    def __init__(
        self,
        pipe: Any,
        width: int,
        height: int,
        max_sequence_length: int | None = None,
        num_frames: int | None = None,
        fps: int | None = None,
        loras: LoraActivator | None = None,
    ) -> None:
        family = family_of(pipe).name
        if family not in ADAPTERS:
            known = ", ".join(sorted(ADAPTERS))
            raise UnsupportedPipeline(f"{type(pipe).__name__} ({family}) has no step mode; step-mode families: {known}")
        canvas = Canvas(width, height, max_sequence_length, num_frames, fps)
        self.adapter: FamilyAdapter = ADAPTERS[family](pipe, canvas)
        self.loras = loras
        """Applies each row's LoRA adapter (None: rows take none; ``join`` refuses a row with one)."""
        self.mixes_loras = ADAPTERS[family].mixes_lora
        """Whether one denoiser call mixes adapters (the family's trait; False once the pipeline raised
        ``LoraMixingError``: a step then calls the denoiser once per adapter)."""
        self._live: dict[str, _LiveRow] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_key(cls, pipe: Any, key: StepKey, loras: LoraActivator | None = None) -> StepEngine:
        """An engine for the requests of ``key``; ValueError naming the field the step engine cannot run."""
        tasks = step_tasks(pipe)
        if tasks and key.task is not None and key.task not in tasks:  # None: each row's own (``join`` checks it)
            names = ", ".join(sorted(tasks))
            raise ValueError(f"task: step mode runs {names} on {type(pipe).__name__}, not {key.task}")
        return cls(pipe, key.width, key.height, key.max_sequence_length, key.num_frames, key.fps, loras)

    @contextmanager
    def _adapters(self, loras: Sequence[LoraRef | None]) -> Iterator[None]:
        """For one call whose batch rows have ``loras`` (in batch order): each row's own adapter, or none."""
        if self.loras is None:
            yield
        elif len(set(loras)) == 1:
            self.loras.activate(loras[0])
            yield
        else:
            with self.loras.mixed(loras):
                yield

    @property
    def live(self) -> tuple[str, ...]:
        """Ids of the rows in the running set, in joining order."""
        with self._lock:
            return tuple(self._live)

    def __len__(self) -> int:
        with self._lock:
            return len(self._live)

    def progress(self) -> list[RowProgress]:
        """Where each live row stands."""
        with self._lock:
            return [live.progress() for live in self._live.values()]

    @torch.no_grad()
    def join(self, rows: Sequence[Row]) -> None:
        """Add ``rows`` to the running set; they take their first step at the next :meth:`step`.

        Their prompts are encoded in one batch and their initial latents drawn in one batch (each from its own
        generator). ValueError naming the field for a row the engine cannot take (a duplicate id, steps < 1, ...);
        then no row joins.
        """
        if not rows:
            return
        ids = [row.id for row in rows]
        with self._lock:
            taken = set(self._live)
        for row in rows:
            row.check()
            if row.task not in self.adapter.tasks:
                raise ValueError(f"row {row.id}: task: {type(self.adapter.pipe).__name__} takes no {row.task} rows")
            if row.lora is not None and self.loras is None:
                raise ValueError(f"row {row.id}: lora: this engine applies no LoRA adapters")
        duplicate = next((row_id for i, row_id in enumerate(ids) if row_id in taken or row_id in ids[:i]), None)
        if duplicate is not None:
            raise ValueError(f"row {duplicate} is already in the running set")
        adapter = self.adapter
        schedulers = [adapter.scheduler_for(row.steps) for row in rows]
        begins = [adapter.begin(row, scheduler) for row, scheduler in zip(rows, schedulers, strict=True)]
        prompts = self._encode(rows)
        dtype = prompts[0].cond["encoder_hidden_states"].dtype
        text = [i for i, row in enumerate(rows) if not row.task.needs_image]
        starts: dict[int, tuple[torch.Tensor, Inpainting | None]] = {}
        if text:
            drawn = adapter.initial_latents([rows[i] for i in text], [schedulers[i] for i in text], dtype)
            starts.update((i, (x, None)) for i, x in zip(text, drawn, strict=True))
        for i, row in enumerate(rows):
            if row.task.needs_image:
                starts[i] = adapter.image_start(row, schedulers[i], begins[i], dtype)
        with self._lock:
            for i, (row, scheduler, prompt) in enumerate(zip(rows, schedulers, prompts, strict=True)):
                x, inpainting = starts[i]
                self._live[row.id] = _LiveRow(row, scheduler, x, prompt, begin=begins[i], inpainting=inpainting)

    def abort(self, row_id: str) -> bool:
        """Drop the row now (any thread): it takes no further step and is never returned. False when no such row
        is live (finished, aborted, or never joined)."""
        with self._lock:
            return self._live.pop(row_id, None) is not None

    def abort_request(self, request_id: str) -> list[str]:
        """Drop every live row of ``request_id``; the ids dropped."""
        with self._lock:
            dropped = [row_id for row_id, live in self._live.items() if live.row.request_id == request_id]
            for row_id in dropped:
                del self._live[row_id]
            return dropped

    @torch.no_grad()
    def step(self, only: Collection[str] | None = None) -> list[Finished]:
        """Advance every live row (or only the rows ``only`` names) by one denoising step, in one denoiser call,
        and return the rows this step finished (they leave the running set), in joining order.

        The call's batch is the guided rows' unconditional halves followed by every row's conditional half, each
        at its row's own timestep (a row with guidance scale <= 1 has no unconditional half).
        """
        with self._lock:
            batch = [live for row_id, live in self._live.items() if only is None or row_id in only]
        if not batch:
            return []
        adapter = self.adapter
        unconds = {i: live.prompt.uncond for i, live in enumerate(batch) if live.prompt.uncond is not None}
        guided = list(unconds)
        scaled = [live.scale_model_input() for live in batch]
        order = [*guided, *range(len(batch))]
        halves = [*unconds.values(), *(live.prompt.cond for live in batch)]
        prediction = self._predict(
            [scaled[i] for i in order],
            [batch[i].timestep for i in order],
            halves,
            [batch[i].row.lora for i in order],
        )
        unconditional, conditional = prediction[: len(guided)], prediction[len(guided) :]
        where_guided = {i: g for g, i in enumerate(guided)}
        for i, live in enumerate(batch):
            noise = conditional[i : i + 1]
            if i in where_guided:
                g = where_guided[i]
                noise = adapter.guide(unconditional[g : g + 1], noise, live.row)
            kwargs = adapter.step_kwargs(live.row)
            live.latents = live.scheduler.step(noise, live.timestep, live.latents, **kwargs, return_dict=False)[0]
            if live.inpainting is not None:
                live.latents = live.inpainting.after_step(live.latents, live.scheduler, live.next_timestep)
            live.index += 1
        finished: list[Finished] = []
        with self._lock:
            for live in batch:
                if live.index >= live.total and self._live.get(live.row.id) is live:
                    del self._live[live.row.id]
                    finished.append(Finished(live.row, live.latents))
        return finished

    def _encode(self, rows: Sequence[Row]) -> list[Prompt]:
        """The rows' encoded prompts: one encoder call, each row with its own adapter; where the pipeline cannot
        mix them (``LoraMixingError``, remembered), one call per adapter."""
        groups: dict[LoraRef | None, list[int]] = {}
        for i, row in enumerate(rows):
            groups.setdefault(row.lora, []).append(i)
        if len(groups) == 1 or self.mixes_loras:
            try:
                with self._adapters([row.lora for row in rows]):
                    return self.adapter.encode(rows)
            except LoraMixingError as exc:
                log.warning("%s cannot mix LoRA adapters (%s): one call per adapter", type(self.adapter).__name__, exc)
                self.mixes_loras = False
        prompts: dict[int, Prompt] = {}
        for lora, members in groups.items():
            with self._adapters([lora]):
                prompts.update(zip(members, self.adapter.encode([rows[i] for i in members]), strict=True))
        return [prompts[i] for i in range(len(rows))]

    def _predict(
        self,
        inputs: Sequence[torch.Tensor],
        timesteps: Sequence[torch.Tensor],
        halves: Sequence[Conditioning],
        loras: Sequence[LoraRef | None],
    ) -> torch.Tensor:
        """The denoiser's prediction for a step's batch rows (inputs, timesteps, conditioning halves and adapters in
        batch order): one call, each row with its own adapter; where the pipeline's LoRA layers cannot mix them
        (``LoraMixingError``, remembered), one call per adapter, the predictions put back in batch order."""
        adapter = self.adapter
        groups: dict[LoraRef | None, list[int]] = {}
        for i, lora in enumerate(loras):
            groups.setdefault(lora, []).append(i)
        if len(groups) == 1 or self.mixes_loras:
            try:
                with self._adapters(loras):
                    sample, steps = torch.cat(list(inputs)), torch.stack(list(timesteps))
                    return adapter.denoise(sample, steps, adapter.collate(halves))
            except LoraMixingError as exc:
                name = type(adapter).__name__
                log.warning("%s cannot mix LoRA adapters in a step (%s): one call per adapter", name, exc)
                self.mixes_loras = False
        out: list[torch.Tensor | None] = [None] * len(inputs)
        for lora, members in groups.items():
            with self._adapters([lora]):
                part = adapter.denoise(
                    torch.cat([inputs[i] for i in members]),
                    torch.stack([timesteps[i] for i in members]),
                    adapter.collate([halves[i] for i in members]),
                )
            for k, i in enumerate(members):
                out[i] = part[k : k + 1]
        return torch.cat([tensor for tensor in out if tensor is not None])

    @torch.no_grad()
    def decode(self, finished: Sequence[Finished], output_type: str = "pil") -> list[Any]:
        """Decode finished rows in one VAE call: one output per row, in order (PIL images for ``pil``; ``np`` and
        ``pt`` as the pipeline's image processor gives them, ``latent`` the latents themselves)."""
        if not finished:
            return []
        if output_type == "latent":
            return [done.latents for done in finished]
        return self.adapter.decode_finished(finished, output_type)
