"""A pipeline family's half of the step engine: what one diffusers pipeline does per row, taken apart so the engine
can run it over a changing set of rows.

The engine (:mod:`gpu_worker.step_engine.engine`) owns the rows and the loop; an adapter mirrors its pipeline's
``__call__`` piece by piece: prompt encoding, each row's scheduler and initial latents, the denoiser call, guidance,
the scheduler step's extra arguments, and decoding. Each piece is written to match what the pipeline computes for
that row when called alone (diffusers 0.42; docs/step_mode.md says where the results differ and by how much).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gpu_worker.step_engine.rows import Finished, Row
from shared.contracts import Task

if TYPE_CHECKING:
    from gpu_worker.step_engine.image_task import Inpainting

Conditioning = Mapping[str, torch.Tensor]
"""Denoiser keyword -> one row's tensor for it (a batch of one), e.g. ``encoder_hidden_states``."""


@dataclass(frozen=True, slots=True)
class Canvas:
    """What every row of a running set shares (the step key's part the engine sees): the output size, the
    prompt sequence length, and a video's frames and frame rate (None: the pipeline's default)."""

    width: int
    height: int
    max_sequence_length: int | None = None
    num_frames: int | None = None
    fps: int | None = None


@dataclass(frozen=True, slots=True)
class Prompt:
    """One row's encoded prompt: the conditional half, and the unconditional half when the row is guided."""

    cond: Conditioning
    uncond: Conditioning | None


def split(batch: Mapping[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
    """A batch of ``count`` rows' tensors, one dict (batch of one) per row."""
    return [{name: tensor[i : i + 1] for name, tensor in batch.items()} for i in range(count)]


class FamilyAdapter(ABC):
    """One pipeline family's pieces, bound to a loaded pipeline and a canvas."""

    family: ClassVar[str]
    """The ``gpu_worker.families`` name of the family."""
    denoiser_name: ClassVar[str]
    """The pipeline component called once per step (``unet``, ``transformer``)."""
    scales_initial_noise: ClassVar[bool]
    """Whether the pipeline multiplies initial latents by ``scheduler.init_noise_sigma``."""
    rescales_guidance: ClassVar[bool]
    """Whether the pipeline applies ``guidance_rescale``."""
    passes_eta_and_generator: ClassVar[bool] = False
    """Whether the pipeline passes ``eta`` (0.0) and the generator to ``scheduler.step`` where the step takes them
    (``prepare_extra_step_kwargs``: the UNet families, PixArt)."""
    tasks: ClassVar[frozenset[Task]] = frozenset({Task.TEXT_TO_IMAGE})
    """The tasks a row of this family may have (``gpu_worker.step_engine.image_task.ImageTasks`` adds the image
    tasks); rows of every task listed share a set."""
    mixes_lora: ClassVar[bool] = True
    """Whether rows of one set may have different LoRA adapters (peft's per-row ``adapter_names`` in the denoiser
    and the text encoders); False keeps the adapter in the step key (``ModelTraits.step_rows``)."""
    video: ClassVar[bool] = False
    """Whether the family makes videos: the canvas's ``num_frames`` and ``fps`` are its (else a canvas with frames
    is refused)."""

    def __init__(self, pipe: Any, canvas: Canvas) -> None:
        self.pipe = pipe
        self.canvas = canvas
        multiple = self.size_multiple
        for name in ("width", "height"):
            value = getattr(canvas, name)
            if value <= 0 or value % multiple:
                raise ValueError(f"{name} must be a positive multiple of {multiple} for {type(pipe).__name__}")
        if canvas.num_frames is not None and not self.video:
            raise ValueError(f"num_frames: {type(pipe).__name__} makes images, not videos, in step mode")
        step_params = inspect.signature(pipe.scheduler.step).parameters
        self._step_takes = frozenset(step_params)

    def call_default(self, name: str) -> Any:
        """The default of the pipeline's ``__call__`` argument ``name``: what the pipeline does when a caller leaves
        it out (a row that does not set it gets the same)."""
        return inspect.signature(type(self.pipe).__call__).parameters[name].default

    @property
    def denoiser(self) -> Any:
        """The pipeline's denoiser module (``unet``, ``transformer``)."""
        return getattr(self.pipe, self.denoiser_name)

    @property
    def device(self) -> torch.device:
        """Where the pipeline runs (what its ``__call__`` uses)."""
        device: torch.device = self.pipe._execution_device
        return device

    @property
    def size_multiple(self) -> int:
        """What width and height must be multiples of."""
        return int(self.pipe.vae_scale_factor)

    def latent_shape(self) -> tuple[int, int, int]:
        """Channels, height, width of one row's latents."""
        scale = self.pipe.vae_scale_factor
        channels = int(self.denoiser.config.in_channels)
        return channels, self.canvas.height // scale, self.canvas.width // scale

    def guided(self, row: Row) -> bool:
        """Whether the row runs classifier-free guidance (an unconditional half): guidance scale above 1."""
        return row.guidance_scale > 1.0

    def scheduler_for(self, steps: int) -> Any:
        """A fresh scheduler of the pipeline's type and config, with its timesteps for ``steps`` set."""
        scheduler = type(self.pipe.scheduler).from_config(self.pipe.scheduler.config)
        scheduler.set_timesteps(steps, device=self.device, **self.timestep_kwargs())
        return scheduler

    def begin(self, row: Row, scheduler: Any) -> int:
        """The index of the row's first timestep in its scheduler's (0: text-to-image runs the whole schedule)."""
        return 0

    def image_start(
        self, row: Row, scheduler: Any, begin: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, Inpainting | None]:
        """An image row's initial latents and its inpainting condition; only families whose ``tasks`` list image
        tasks have it (``ImageTasks``)."""
        raise ValueError(f"task: {type(self.pipe).__name__} takes no {row.task} rows in step mode")

    def timestep_kwargs(self) -> dict[str, Any]:
        """What the pipeline adds to ``set_timesteps`` besides the step count and device."""
        return {}

    def initial_latents(self, rows: Sequence[Row], schedulers: Sequence[Any], dtype: torch.dtype) -> list[torch.Tensor]:
        """Each row's starting latents: a standard normal draw from its own generator (all rows in one
        ``randn_tensor`` call with a generator list, which draws each row from its generator alone), scaled by
        its own scheduler's ``init_noise_sigma`` where the pipeline scales."""
        from diffusers.utils.torch_utils import randn_tensor

        shape = (len(rows), *self.latent_shape())
        noise = randn_tensor(shape, generator=[row.generator for row in rows], device=self.device, dtype=dtype)
        latents = [noise[i : i + 1] for i in range(len(rows))]
        if self.scales_initial_noise:
            latents = [x * scheduler.init_noise_sigma for x, scheduler in zip(latents, schedulers, strict=True)]
        return latents

    @abstractmethod
    def encode(self, rows: Sequence[Row]) -> list[Prompt]:
        """Encode every row's prompt (and negative prompt, for guided rows) in one batched call."""

    @abstractmethod
    def denoise(self, sample: torch.Tensor, timesteps: torch.Tensor, conditioning: Conditioning) -> torch.Tensor:
        """One denoiser call over ``sample`` (the batch), ``timesteps`` (one per batch row) and the conditioning
        tensors concatenated in the same row order."""

    def collate(self, halves: Sequence[Conditioning]) -> dict[str, torch.Tensor]:
        """The denoiser call's conditioning from the halves in its batch order: each tensor concatenated. A family
        whose rows' tensors differ in shape (Qwen-Image's prompts of their own lengths) pads them here."""
        return {name: torch.cat([half[name] for half in halves]) for name in halves[0]}

    def guide(self, uncond: torch.Tensor, cond: torch.Tensor, row: Row) -> torch.Tensor:
        """Classifier-free guidance of one row with its own scale (and rescale, where the pipeline rescales)."""
        guided = uncond + row.guidance_scale * (cond - uncond)
        if self.rescales_guidance and row.guidance_rescale > 0.0:
            from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import rescale_noise_cfg

            guided = rescale_noise_cfg(guided, cond, guidance_rescale=row.guidance_rescale)  # type: ignore[no-untyped-call]
        return guided

    def step_kwargs(self, row: Row) -> dict[str, Any]:
        """Extra arguments of the row's ``scheduler.step``: ``eta`` and the row's generator where the family passes
        them and the step takes them, else none."""
        kwargs: dict[str, Any] = {}
        if self.passes_eta_and_generator:
            if "eta" in self._step_takes:
                kwargs["eta"] = 0.0
            if "generator" in self._step_takes:
                kwargs["generator"] = row.generator
        return kwargs

    @abstractmethod
    def decode(self, latents: torch.Tensor, output_type: str) -> list[Any]:
        """Decode a batch of final latents in one VAE call; one output (a PIL image for ``pil``) per row."""

    def decode_finished(self, finished: Sequence[Finished], output_type: str) -> list[Any]:
        """Decode finished rows in one VAE call (:meth:`decode` of their latents); a family whose pipelines decode
        a task's rows differently (SD3's inpainting) tells them apart here."""
        return self.decode(torch.cat([done.latents for done in finished]), output_type)
