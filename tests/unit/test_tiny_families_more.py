"""The tiny SDXL, Sana and Qwen-Image pipelines (demo_models): they save and load through
``DiffusionPipeline.from_pretrained``, a fused call equals its solo calls, and the call-surface facts the serving
layer's capability adapters rely on (size multiple, negative prompt / guidance knobs, sequence length, resolution
binning, step callbacks and interrupts, img2img / inpaint siblings, one generator per image).

Every pipeline is built once per module, saved, loaded back, and the loaded copy is what the tests call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from demo_models import qwen_image, sana, sdxl
from tests.support.pipeline_siblings import assert_siblings_run

SIZE = 32
PROMPTS = ["a cat", "a photo of a red fox in the forest at night, painting style", "Blue sky!"]
NEGATIVES = ["blue", "a photo of a dog with a green car", "ugly"]


@dataclass(frozen=True)
class Family:
    build: Callable[[], Any]
    pipeline_class: str
    extra: dict[str, Any] = field(default_factory=dict)
    """Arguments every call of the family takes (Sana: no resolution binning; Qwen-Image: true CFG on)."""


FAMILIES = {
    "sdxl": Family(sdxl.build, "StableDiffusionXLPipeline", {"guidance_scale": 5.0}),
    "sana": Family(sana.build, "SanaPipeline", {"guidance_scale": 4.5, "use_resolution_binning": False}),
    "qwen_image": Family(qwen_image.build, "QwenImagePipeline", {"true_cfg_scale": 4.0}),
}


class Loaded:
    """Builds, saves and loads each family once (lazily); ``paths[name]`` is where it was saved."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.paths: dict[str, Path] = {}
        self._pipes: dict[str, Any] = {}

    def __call__(self, name: str) -> Any:
        if name not in self._pipes:
            from diffusers import DiffusionPipeline

            path = self.root / name
            FAMILIES[name].build().save_pretrained(path)
            pipe = DiffusionPipeline.from_pretrained(path)  # type: ignore[no-untyped-call]
            pipe.set_progress_bar_config(disable=True)
            self.paths[name] = path
            self._pipes[name] = pipe
        return self._pipes[name]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """The models are too small to gain from threads, and two spinning threads on a shared 2-core machine are
    many times slower than one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    return Loaded(tmp_path_factory.mktemp("tiny-families"))


def _gens(*seeds: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed) for seed in seeds]


def _call(pipe: Any, name: str, **kwargs: Any) -> Any:
    args: dict[str, Any] = {"height": SIZE, "width": SIZE, "num_inference_steps": 2, **FAMILIES[name].extra}
    args.update(kwargs)
    return pipe(**args).images


def _latents(pipe: Any, name: str, **kwargs: Any) -> torch.Tensor:
    """One denoising step, no decode: enough to tell whether an argument reached the model."""
    args: dict[str, Any] = {"prompt": "a cat", "generator": _gens(7), "num_inference_steps": 1, "output_type": "latent"}
    args.update(kwargs)
    out: torch.Tensor = _call(pipe, name, **args)
    return out


def _assert_siblings_run(pipe: Any, img2img: str, inpaint: str, **kwargs: Any) -> None:
    """AutoPipelineForImage2Image / AutoPipelineForInpainting.from_pipe(pipe) give these classes, and they run."""
    from PIL import Image

    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8))
    mask = Image.fromarray(np.tile((np.arange(SIZE) >= SIZE // 2).astype(np.uint8) * 255, (SIZE, 1)))
    assert_siblings_run(
        pipe,
        img2img,
        inpaint,
        image=image,
        mask=mask,
        size=SIZE,
        generator=lambda: _gens(0),
        strength=0.5,
        num_inference_steps=2,
        **kwargs,
    )


def _arrays(images: list[Any]) -> list[np.ndarray]:
    return [np.asarray(image, dtype=np.int16) for image in images]


def _assert_equal_images(fused: list[Any], solo: list[Any]) -> None:
    assert len(fused) == len(solo)
    a, b = _arrays(fused), _arrays(solo)
    diffs = [int(np.abs(x - y).max()) for x, y in zip(a, b, strict=True)]
    assert all(d <= 1 for d in diffs), f"fused vs solo max |diff| per image (uint8): {diffs}"
    # Not vacuous: the images themselves differ from one another by far more than the tolerance.
    assert all(int(np.abs(x - y).max()) > 8 for i, x in enumerate(a) for y in a[i + 1 :])


# 1. save_pretrained -> DiffusionPipeline.from_pretrained -> a call at the smallest size


@pytest.mark.parametrize("name", list(FAMILIES))
def test_saves_loads_and_generates(loaded: Loaded, name: str) -> None:
    pipe = loaded(name)
    assert type(pipe).__name__ == FAMILIES[name].pipeline_class
    assert (loaded.paths[name] / "model_index.json").is_file()
    images = _call(pipe, name, prompt="a photo of a cat", generator=_gens(0), output_type="pil")
    assert [image.size for image in images] == [(SIZE, SIZE)]
    # Seeded build: a fresh build has exactly the saved weights (so every process builds the same model).
    fresh = FAMILIES[name].build()
    for component, module in pipe.components.items():
        if isinstance(module, torch.nn.Module):
            theirs = fresh.components[component].state_dict()
            for key, tensor in module.state_dict().items():
                assert torch.equal(tensor, theirs[key]), f"{component}.{key} differs between builds"


# 2. fused == solo


@pytest.mark.parametrize("name", list(FAMILIES))
def test_fused_equals_solo(loaded: Loaded, name: str) -> None:
    """Three prompts of different token lengths in one call (Qwen-Image pads the batch to its longest prompt and
    masks the padding; Sana and SDXL pad every prompt to a fixed length) equal each prompt alone."""
    pipe = loaded(name)
    seeds = [11, 12, 13]
    fused = _call(pipe, name, prompt=PROMPTS, negative_prompt=NEGATIVES, generator=_gens(*seeds))
    solo = [
        image
        for prompt, negative, seed in zip(PROMPTS, NEGATIVES, seeds, strict=True)
        for image in _call(pipe, name, prompt=[prompt], negative_prompt=[negative], generator=_gens(seed))
    ]
    _assert_equal_images(fused, solo)


def test_fused_equals_solo_two_images_per_prompt_sdxl(loaded: Loaded) -> None:
    pipe = loaded("sdxl")
    seeds = [21, 22, 23, 24, 25, 26]
    fused = _call(
        pipe, "sdxl", prompt=PROMPTS, negative_prompt=NEGATIVES, generator=_gens(*seeds), num_images_per_prompt=2
    )
    solo = [
        image
        for i, (prompt, negative) in enumerate(zip(PROMPTS, NEGATIVES, strict=True))
        for image in _call(
            pipe,
            "sdxl",
            prompt=prompt,
            negative_prompt=negative,
            generator=_gens(*seeds[2 * i : 2 * i + 2]),
            num_images_per_prompt=2,
        )
    ]
    _assert_equal_images(fused, solo)


def _masks_n1_n2(pipe: Any, name: str) -> tuple[list[list[int]], list[list[int]]]:
    prompts = PROMPTS[:2]
    if name == "sana":

        def encode(n: int) -> torch.Tensor:
            mask: torch.Tensor = pipe.encode_prompt(
                prompts,
                do_classifier_free_guidance=False,
                num_images_per_prompt=n,
                device="cpu",
                max_sequence_length=16,
                complex_human_instruction=None,
            )[1]
            return mask

    else:

        def encode(n: int) -> torch.Tensor:
            mask: torch.Tensor = pipe.encode_prompt(prompts, num_images_per_prompt=n, device="cpu")[1]
            return mask

    with torch.no_grad():
        return encode(1).tolist(), encode(2).tolist()


@pytest.mark.parametrize("name", ["sana", "qwen_image"])
def test_more_images_per_prompt_misorders_text_masks(loaded: Loaded, name: str) -> None:
    """diffusers bug (0.42.1) in Sana's and Qwen-Image's encode_prompt: with num_images_per_prompt=n > 1 the prompt
    embeddings are interleaved (p0, p0, p1, p1) but their attention masks are tiled (m0, m1, m0, m1), so in a batch
    of prompts of different token lengths images get another prompt's mask and fused != solo (up to 60/255 on the
    tiny Sana, 5/255 on the tiny Qwen-Image). Serving must expand prompts instead (next test). If this fails,
    diffusers fixed it and the expansion can go."""
    ones, twos = _masks_n1_n2(loaded(name), name)
    assert ones[0] != ones[1]
    assert twos == [ones[0], ones[1], ones[0], ones[1]]


@pytest.mark.parametrize("name", ["sana", "qwen_image"])
def test_expanded_prompts_equal_solo_with_two_images_per_prompt(loaded: Loaded, name: str) -> None:
    """The workaround: each prompt repeated n times with num_images_per_prompt=1 equals the solo n=2 calls."""
    pipe = loaded(name)
    seeds = [31, 32, 33, 34, 35, 36]
    fused = _call(
        pipe,
        name,
        prompt=[p for p in PROMPTS for _ in (1, 2)],
        negative_prompt=[q for q in NEGATIVES for _ in (1, 2)],
        generator=_gens(*seeds),
    )
    solo = [
        image
        for i, (prompt, negative) in enumerate(zip(PROMPTS, NEGATIVES, strict=True))
        for image in _call(
            pipe,
            name,
            prompt=prompt,
            negative_prompt=negative,
            generator=_gens(*seeds[2 * i : 2 * i + 2]),
            num_images_per_prompt=2,
        )
    ]
    _assert_equal_images(fused, solo)


# 3. facts for the capability adapters: common to the three families


@pytest.mark.parametrize("name", list(FAMILIES))
def test_step_callback_and_interrupt(loaded: Loaded, name: str) -> None:
    """callback_on_step_end runs after each step with the latents; setting ``pipe._interrupt`` skips the remaining
    steps, the call still decodes and returns images, and the next call starts uninterrupted."""
    pipe = loaded(name)
    steps: list[int] = []

    def stop_after_first(p: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        assert isinstance(kwargs["latents"], torch.Tensor)
        steps.append(i)
        p._interrupt = True
        return kwargs

    images = _call(
        pipe,
        name,
        prompt="a cat",
        generator=_gens(0),
        num_inference_steps=3,
        callback_on_step_end=stop_after_first,
        callback_on_step_end_tensor_inputs=["latents"],
    )
    assert steps == [0]
    assert [image.size for image in images] == [(SIZE, SIZE)]

    def record(p: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        steps.append(i)
        return kwargs

    steps.clear()
    _latents(pipe, name, num_inference_steps=3, callback_on_step_end=record)
    assert steps == [0, 1, 2]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_one_generator_per_image_is_checked(loaded: Loaded, name: str) -> None:
    with pytest.raises(ValueError, match="generators"):
        _call(loaded(name), name, prompt=["a cat", "a dog"], generator=_gens(1, 2, 3), output_type="latent")


# 3. facts: SDXL


def test_sdxl_facts(loaded: Loaded) -> None:
    pipe = loaded("sdxl")
    # Size: multiples of 8 (ValueError otherwise); 40 (not a multiple of 16) is fine.
    with pytest.raises(ValueError, match="divisible by 8"):
        _latents(pipe, "sdxl", height=36, width=SIZE)
    assert _call(pipe, "sdxl", prompt="a cat", height=40, width=48, generator=_gens(0))[0].size == (48, 40)
    # negative_prompt and guidance_scale: classic CFG when guidance_scale > 1; at 1 the negative prompt is unused.
    base = _latents(pipe, "sdxl", negative_prompt="blue")
    assert not torch.allclose(base, _latents(pipe, "sdxl", negative_prompt="ugly"))
    assert not torch.allclose(base, _latents(pipe, "sdxl", negative_prompt="blue", guidance_scale=7.0))
    no_cfg = _latents(pipe, "sdxl", negative_prompt="blue", guidance_scale=1.0)
    assert torch.equal(no_cfg, _latents(pipe, "sdxl", negative_prompt="ugly", guidance_scale=1.0))
    # guidance_rescale is used (with CFG).
    assert not torch.allclose(base, _latents(pipe, "sdxl", negative_prompt="blue", guidance_rescale=0.7))
    # __call__ takes **kwargs: unknown arguments (true_cfg_scale, max_sequence_length) are silently ignored.
    assert torch.equal(base, _latents(pipe, "sdxl", negative_prompt="blue", true_cfg_scale=4.0, max_sequence_length=8))
    # Prompts are cut at CLIP's 77 tokens (both tokenizers), with a logged warning.
    assert pipe.tokenizer.model_max_length == pipe.tokenizer_2.model_max_length == 77
    assert pipe.config.force_zeros_for_empty_prompt  # no negative prompt: zero negative embeddings
    _assert_siblings_run(pipe, "StableDiffusionXLImg2ImgPipeline", "StableDiffusionXLInpaintPipeline")


# 3. facts: Sana


class _Stop(Exception):
    pass


def _latent_request(pipe: Any, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> tuple[int, int]:
    """The (height, width) Sana builds its latents for, stopping the call there."""
    seen: list[tuple[int, int]] = []

    def prepare_latents(batch: int, channels: int, height: int, width: int, *args: Any, **kw: Any) -> None:
        seen.append((int(height), int(width)))
        raise _Stop

    monkeypatch.setattr(pipe, "prepare_latents", prepare_latents)
    with pytest.raises(_Stop):
        pipe(prompt="a cat", num_inference_steps=1, **kwargs)
    monkeypatch.undo()
    return seen[0]


def test_sana_facts(loaded: Loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    from diffusers import AutoPipelineForImage2Image, AutoPipelineForInpainting

    pipe = loaded("sana")
    # Size: multiples of 32 (ValueError otherwise).
    with pytest.raises(ValueError, match="divisible by 32"):
        _latents(pipe, "sana", height=48, width=SIZE)
    # Resolution binning (on by default) generates at the nearest bin of the 1024 px table for this
    # transformer's sample_size 32 (1024 x 1024 for any square) and only then resizes and crops to the request:
    # the requested size is generated only with use_resolution_binning=False.
    assert _latent_request(pipe, monkeypatch, height=SIZE, width=SIZE) == (1024, 1024)
    assert _latent_request(pipe, monkeypatch, height=64, width=SIZE, use_resolution_binning=False) == (64, SIZE)
    # negative_prompt (default "") and guidance_scale: classic CFG when guidance_scale > 1.
    base = _latents(pipe, "sana", negative_prompt="blue")
    assert not torch.allclose(base, _latents(pipe, "sana", negative_prompt="ugly"))
    no_cfg = _latents(pipe, "sana", negative_prompt="blue", guidance_scale=1.0)
    assert torch.equal(no_cfg, _latents(pipe, "sana", negative_prompt="ugly", guidance_scale=1.0))
    # No true_cfg_scale, no guidance_rescale: __call__ has no **kwargs, so they are TypeErrors.
    for unknown in ("true_cfg_scale", "guidance_rescale"):
        with pytest.raises(TypeError, match=unknown):
            _latents(pipe, "sana", **{unknown: 2.0})
    # max_sequence_length (default 300, no cap in the pipeline): the text embeddings are exactly that long.
    lengths: list[int] = []

    def seq_len(p: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        lengths.append(kwargs["prompt_embeds"].shape[1])
        return kwargs

    for max_len in (16, 300):
        _latents(
            pipe,
            "sana",
            max_sequence_length=max_len,
            callback_on_step_end=seq_len,
            callback_on_step_end_tensor_inputs=["prompt_embeds"],
        )
    assert lengths == [16, 300]
    for auto in (AutoPipelineForImage2Image, AutoPipelineForInpainting):
        with pytest.raises(ValueError, match="can't find a pipeline linked to SanaPipeline"):
            auto.from_pipe(pipe)


# 3. facts: Qwen-Image


def test_qwen_image_facts(loaded: Loaded) -> None:
    pipe = loaded("qwen_image")
    # The tokenizer reproduces the 34-token template prefix the pipeline drops.
    prefix = pipe.prompt_template_encode.split("{}")[0]
    assert len(pipe.tokenizer(prefix).input_ids) == pipe.prompt_template_encode_start_idx == 34
    # Size: multiples of vae_scale_factor * 2 (8 here, 16 for the real VAE); others are rounded DOWN, with a
    # logged warning, and the image comes back at the rounded size.
    assert pipe.vae_scale_factor * 2 == 8
    assert _call(pipe, "qwen_image", prompt="a cat", height=36, width=44, generator=_gens(0))[0].size == (40, 32)
    # negative_prompt is used only with true_cfg_scale > 1 (default 4.0); without one there is no CFG at all.
    base = _latents(pipe, "qwen_image", negative_prompt="blue")
    assert not torch.allclose(base, _latents(pipe, "qwen_image", negative_prompt="ugly"))
    no_cfg = _latents(pipe, "qwen_image", negative_prompt="blue", true_cfg_scale=1.0)
    assert torch.equal(no_cfg, _latents(pipe, "qwen_image", negative_prompt="ugly", true_cfg_scale=1.0))
    assert torch.equal(no_cfg, _latents(pipe, "qwen_image", true_cfg_scale=4.0))
    # guidance_scale only feeds guidance-distilled transformers (guidance_embeds); here it is ignored.
    assert not pipe.transformer.config.guidance_embeds
    assert torch.equal(no_cfg, _latents(pipe, "qwen_image", true_cfg_scale=1.0, guidance_scale=7.0))
    # No guidance_rescale (TypeError); max_sequence_length (default 512) is capped at 1024.
    with pytest.raises(TypeError, match="guidance_rescale"):
        _latents(pipe, "qwen_image", guidance_rescale=0.7)
    with pytest.raises(ValueError, match="cannot be greater than 1024"):
        _latents(pipe, "qwen_image", max_sequence_length=1025)
    _assert_siblings_run(pipe, "QwenImageImg2ImgPipeline", "QwenImageInpaintPipeline", true_cfg_scale=1.0)
