"""Pipeline families: what each diffusers pipeline family takes, and how a batch maps onto its one call.

A family is data, not a branch in the runner: its ``ModelTraits`` (announced by the worker; the api refuses what
the model cannot do, naming the field), the pipeline classes it covers, and the call arguments it adds. The runner
picks the family of its loaded pipeline by class (``family_of``). A pipeline no family claims runs request by
request inside its batch (the seed's fallback for pipelines that do not declare batch support), with permissive
traits, and the worker says so at start.

Every family here takes a list of prompts (and of negative prompts) and one ``torch.Generator`` per output; the
runner passes one row per output, so a fused row equals its solo run (tests/integration/test_families.py proves
it per family).

A new family is one entry of ``FAMILIES`` (its name, pipeline classes, traits and call arguments) and its tiny
pipeline in ``demo_models.catalog.DEMO_FAMILIES``; the batch keys need nothing from it (every parameter a fused
call needs one value of is in them, ``shared.contracts.BatchKey``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpu_worker.runner import video_frames
from shared.contracts import ModelTraits, RequestSpec, Task


@dataclass(frozen=True, slots=True)
class PipelineFamily:
    """One family: its traits, the pipeline classes it covers, and what it adds to every call."""

    traits: ModelTraits
    pipeline_classes: frozenset[str]
    fixed_kwargs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """Call arguments every call of this family needs (e.g. ``use_resolution_binning=False``: the requested size,
    not the nearest of the family's trained aspect-ratio bins)."""
    fps_kwarg: str | None = None
    """The name the pipeline gives the frame rate (``frame_rate`` for LTX-Video), where it takes one."""
    derived_pipelines: Mapping[Task, str] = field(default_factory=lambda: MappingProxyType({}))
    """The diffusers class of each image task's pipeline (or a ``"module:Class"`` path to a subclass of one),
    derived from the loaded one with ``from_pipe`` (its components shared), e.g. LTX-Video's image-to-video; empty:
    diffusers' auto pipelines (``gpu_worker.diffusers_runner.DERIVED_PIPELINES``)."""
    loaded_task: Task | None = Task.TEXT_TO_IMAGE
    """The task the loaded pipeline itself runs; None where only its derived pipelines run (an image-to-video
    model: its loaded pipeline needs an image, and takes one per call)."""

    @property
    def name(self) -> str:
        return self.traits.family

    @property
    def per_prompt_kwarg(self) -> str:
        """The name of the outputs-per-prompt argument (``num_videos_per_prompt`` for video pipelines)."""
        return "num_videos_per_prompt" if self.traits.video else "num_images_per_prompt"

    def call_kwargs(self, head: RequestSpec, accepts: frozenset[str]) -> dict[str, Any]:
        """This family's arguments for a batch whose requests all share ``head``'s key (``accepts``: the call's
        parameter names; what the call does not take is left out)."""
        kwargs = {name: value for name, value in self.fixed_kwargs.items() if name in accepts}
        if head.true_cfg_scale is not None and "true_cfg_scale" in accepts:
            kwargs["true_cfg_scale"] = head.true_cfg_scale
        if head.max_sequence_length is not None and "max_sequence_length" in accepts:
            kwargs["max_sequence_length"] = head.max_sequence_length
        if self.traits.video:
            kwargs["num_frames"] = video_frames(head, self.traits)
            if self.fps_kwarg is not None and self.fps_kwarg in accepts:
                kwargs[self.fps_kwarg] = self.fps(head)
        return kwargs

    def fps(self, head: RequestSpec) -> int:
        """The frame rate of ``head``'s videos: its own, else the family's default."""
        return head.fps or self.traits.default_fps or DEFAULT_FPS


DEFAULT_FPS = 24


def _family(name: str, classes: set[str], **traits: Any) -> tuple[str, PipelineFamily]:
    fixed = traits.pop("fixed_kwargs", {})
    fps_kwarg = traits.pop("fps_kwarg", None)
    derived = MappingProxyType(traits.pop("derived_pipelines", {}))
    loaded_task = traits.pop("loaded_task", Task.TEXT_TO_IMAGE)
    family = PipelineFamily(
        ModelTraits(family=name, **traits), frozenset(classes), MappingProxyType(fixed), fps_kwarg, derived, loaded_task
    )
    return name, family


TRUE_CFG: Mapping[str, Any] = MappingProxyType(
    {"negative_prompt": False, "guidance_rescale": False, "true_cfg_scale": True}
)
"""The traits of a guidance-distilled family with true classifier-free guidance (Flux, Qwen-Image): a negative
prompt only with ``true_cfg_scale`` > 1, no guidance rescale."""


WAN: Mapping[str, Any] = MappingProxyType(
    {
        "size_multiple": 16,  # its VAE's 8x times its 2x2 patches (it checks 16)
        "guidance_rescale": False,
        "max_sequence_length": 512,
        "video": True,
        "frames_multiple": 4,
        "default_frames": 81,  # Wan's own default; 16 fps is Wan 2.1's (the call takes no frame rate)
        "default_fps": 16,
    }
)
"""The traits of Wan 2.x, text-to-video (``WanPipeline``) and image-to-video (``WanImageToVideoPipeline``)."""


FAMILIES: Mapping[str, PipelineFamily] = MappingProxyType(
    dict(
        [
            _family("stable-diffusion", {"StableDiffusionPipeline"}),
            _family("stable-diffusion-xl", {"StableDiffusionXLPipeline"}),
            _family(
                "stable-diffusion-3",
                {"StableDiffusion3Pipeline"},
                size_multiple=16,
                guidance_rescale=False,
                max_sequence_length=512,
            ),
            _family("flux", {"FluxPipeline"}, size_multiple=16, max_sequence_length=512, **TRUE_CFG),
            _family(
                "pixart",
                {"PixArtAlphaPipeline", "PixArtSigmaPipeline"},
                size_multiple=16,  # its own check says 8; the transformer's patches need 16
                guidance_rescale=False,
                max_sequence_length=300,
                fixed_kwargs={"use_resolution_binning": False, "clean_caption": False},  # prompts as sent
            ),
            _family(
                "sana",
                {"SanaPipeline"},
                size_multiple=32,
                guidance_rescale=False,
                max_sequence_length=300,
                fixed_kwargs={"use_resolution_binning": False},
            ),
            _family("qwen-image", {"QwenImagePipeline"}, size_multiple=16, max_sequence_length=1024, **TRUE_CFG),
            _family(
                "ltx-video",
                {"LTXPipeline"},
                size_multiple=32,
                max_sequence_length=512,
                video=True,
                frames_multiple=8,
                default_frames=161,  # LTXPipeline's own defaults
                default_fps=25,
                fps_kwarg="frame_rate",
                # a request with an image: that image is the first frame (the same components, no strength)
                derived_pipelines={Task.IMAGE_TO_IMAGE: "LTXImageToVideoPipeline"},
            ),
            _family("wan", {"WanPipeline"}, **WAN),
            _family(
                "wan-i2v",
                {"WanImageToVideoPipeline"},
                **WAN,
                loaded_task=None,  # it needs an image: image-to-video only, one image per row (image_rows)
                derived_pipelines={Task.IMAGE_TO_IMAGE: "gpu_worker.image_rows:WanImageRowsPipeline"},
            ),
        ]
    )
)
"""Every known family by name."""


def family_of(pipeline: object) -> PipelineFamily:
    """The family of ``pipeline``'s class; an unknown class gets a family of its own that is not fused."""
    name = type(pipeline).__name__
    for family in FAMILIES.values():
        if name in family.pipeline_classes:
            return family
    return PipelineFamily(ModelTraits(family=name, fused=False), frozenset({name}))
