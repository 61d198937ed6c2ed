"""The tiny SD3 / Flux / PixArt-Sigma pipelines of ``demo_models``: save/load round trip, fused == solo,
and the per-family facts the serving layer's capability adapters rely on (diffusers 0.42).

Every pipeline here is loaded back from ``save_pretrained`` output, once per module (module-scoped fixtures).
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from demo_models import flux, pixart, sd3  # noqa: E402
from tests.support.pipeline_siblings import assert_siblings_run  # noqa: E402

BUILDERS: dict[str, Callable[[], Any]] = {
    "sd3": lambda: sd3.build(with_t5=False),
    "sd3_t5": lambda: sd3.build(with_t5=True),
    "flux": flux.build,
    "pixart": pixart.build,
}
CLASSES = {
    "sd3": "StableDiffusion3Pipeline",
    "sd3_t5": "StableDiffusion3Pipeline",
    "flux": "FluxPipeline",
    "pixart": "PixArtSigmaPipeline",
}
# Loading a T5-less SD3 folder needs the Nones spelled out: model_index.json records [null, null] for them, and
# text_encoder_3 / tokenizer_3 are not in StableDiffusion3Pipeline._optional_components.
LOAD_KW: dict[str, dict[str, Any]] = {"sd3": {"text_encoder_3": None, "tokenizer_3": None}}
# The tiny PixArt transformer's sample_size (8) has no resolution bins; clean_caption needs bs4 + ftfy.
CALL_KW: dict[str, dict[str, Any]] = {"pixart": {"use_resolution_binning": False, "clean_caption": False}}

PROMPTS = ["a red cat", "a photo of a blue whale in the sea at night", "lighthouse"]
NEGATIVES = ["blue", "", "a dog in the city"]


def _gens(seeds: range | list[int]) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


def _u8(images: list[Any]) -> np.ndarray:
    return np.stack([np.asarray(im) for im in images]).astype(np.int16)


def _deep_vae(latent_channels: int) -> Any:
    """A 4-block VAE (``vae_scale_factor`` 8, as in the real checkpoints) to exercise the real size rules."""
    torch.manual_seed(0)
    return diffusers.AutoencoderKL(
        block_out_channels=(4, 4, 4, 4),
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        latent_channels=latent_channels,
        layers_per_block=1,
        norm_num_groups=1,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    ).eval()


def _with_vae(pipe: Any, vae: Any) -> Any:
    variant = type(pipe)(**{**pipe.components, "vae": vae})
    variant.set_progress_bar_config(disable=True)
    return variant


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    root = tmp_path_factory.mktemp("tiny_families")
    paths = {}
    for name, build in BUILDERS.items():
        build().save_pretrained(root / name)
        paths[name] = root / name
    yield paths


@pytest.fixture(scope="module")
def pipes(saved: dict[str, Path]) -> dict[str, Any]:
    loaded = {}
    for name, path in saved.items():
        pipe = diffusers.DiffusionPipeline.from_pretrained(path, **LOAD_KW.get(name, {}))
        pipe.set_progress_bar_config(disable=True)
        loaded[name] = pipe
    return loaded


def _call(pipes: dict[str, Any], family: str, size: int = 16, steps: int = 2, seed: int = 0, **kw: Any) -> Any:
    kw = {**CALL_KW.get(family, {}), **kw}
    kw.setdefault("generator", torch.Generator().manual_seed(seed))
    return pipes[family](height=size, width=size, num_inference_steps=steps, **kw).images


# ---------------------------------------------------------------------------------------------------------------
# 1. save_pretrained -> DiffusionPipeline.from_pretrained round trip


@pytest.mark.parametrize("family", list(BUILDERS))
def test_round_trip_class_and_size(pipes: dict[str, Any], family: str) -> None:
    pipe = pipes[family]
    assert type(pipe).__name__ == CLASSES[family]
    images = _call(pipes, family, prompt="a red cat", size=32, steps=2, output_type="pil")
    assert [im.size for im in images] == [(32, 32)]
    assert _u8(images).std() > 0


def test_builds_are_seeded_identically() -> None:
    def digest(pipe: Any) -> str:
        h = hashlib.sha256()
        for _, module in sorted(pipe.components.items()):
            if isinstance(module, torch.nn.Module):
                for key, tensor in sorted(module.state_dict().items()):
                    h.update(key.encode())
                    h.update(tensor.numpy().tobytes())
        return h.hexdigest()

    for build in BUILDERS.values():
        assert digest(build()) == digest(build())


def test_sd3_without_t5_needs_explicit_nones(saved: dict[str, Path]) -> None:
    index = json.loads((saved["sd3"] / "model_index.json").read_text())
    assert index["text_encoder_3"] == [None, None] and index["tokenizer_3"] == [None, None]
    with pytest.raises(ValueError, match="expected"):
        diffusers.DiffusionPipeline.from_pretrained(saved["sd3"])


# ---------------------------------------------------------------------------------------------------------------
# 2. fused == solo: one call for 3 prompts x n images vs one call per prompt, one generator per output image

FUSED_CASES = [
    ("sd3", 1, {}),
    ("sd3", 2, {}),
    ("sd3_t5", 1, {}),
    ("flux", 1, {}),  # negatives are ignored without true_cfg_scale > 1: none passed
    ("flux", 2, {"true_cfg_scale": 2.0}),  # true CFG: negatives used
    ("pixart", 1, {}),
]


@pytest.mark.parametrize(("family", "n", "extra"), FUSED_CASES)
def test_fused_equals_solo(pipes: dict[str, Any], family: str, n: int, extra: dict[str, Any]) -> None:
    uses_negatives = family != "flux" or extra.get("true_cfg_scale", 1.0) > 1
    common = {"num_images_per_prompt": n, "output_type": "pil", **extra}
    fused = _call(
        pipes,
        family,
        size=32,
        prompt=PROMPTS,
        negative_prompt=NEGATIVES if uses_negatives else None,
        generator=_gens(range(100, 100 + 3 * n)),  # prompt-major: prompt i owns images i*n .. i*n+n-1
        **common,
    )
    solo: list[Any] = []
    for i, prompt in enumerate(PROMPTS):
        solo += _call(
            pipes,
            family,
            size=32,
            prompt=prompt,
            negative_prompt=NEGATIVES[i] if uses_negatives else None,
            generator=_gens(range(100 + i * n, 100 + (i + 1) * n)),
            **common,
        )
    fused_u8, solo_u8 = _u8(fused), _u8(solo)
    assert fused_u8.shape == (3 * n, 32, 32, 3)
    assert np.abs(fused_u8 - solo_u8).max() <= 1
    assert len({im.tobytes() for im in fused_u8}) == 3 * n  # every image differs: the comparison is not vacuous


# ---------------------------------------------------------------------------------------------------------------
# 3. facts for the capability adapters


def test_size_rules_sd3(pipes: dict[str, Any]) -> None:
    pipe = pipes["sd3"]
    # multiple = vae_scale_factor * patch_size, enforced by check_inputs with a ValueError; tiny: 1 * 1
    assert (pipe.vae_scale_factor, pipe.patch_size) == (1, 1)
    assert [im.size for im in _call(pipes, "sd3", size=40, steps=1, prompt="a cat")] == [(40, 40)]
    assert [im.size for im in _call(pipes, "sd3", size=8, steps=1, prompt="a cat")] == [(8, 8)]
    # largest side: pos_embed_max_size * patch_size * vae_scale_factor (tiny: 96)
    with pytest.raises(ValueError, match="pos_embed_max_size"):
        _call(pipes, "sd3", size=128, steps=1, prompt="a cat")
    # default size: transformer sample_size * vae_scale_factor
    assert pipe.default_sample_size * pipe.vae_scale_factor == 32
    deep = _with_vae(pipe, _deep_vae(16))  # vae_scale_factor 8 -> multiple 8 (real SD3: 8 * patch 2 = 16)
    with pytest.raises(ValueError, match="divisible by 8"):
        deep(prompt="a cat", height=36, width=36, num_inference_steps=1)


def test_size_rules_flux(pipes: dict[str, Any]) -> None:
    pipe = pipes["flux"]
    # multiple = 2 * vae_scale_factor (latents are packed 2x2); NOT enforced: a warning, then floored to it
    assert pipe.vae_scale_factor == 1
    assert [im.size for im in _call(pipes, "flux", size=33, steps=1, prompt="a cat")] == [(32, 32)]
    assert [im.size for im in _call(pipes, "flux", size=40, steps=1, prompt="a cat")] == [(40, 40)]
    # the default size is default_sample_size (128) * vae_scale_factor, not the transformer's
    assert pipe.default_sample_size * pipe.vae_scale_factor == 128
    deep = _with_vae(pipe, _deep_vae(1))  # vae_scale_factor 8 -> multiple 16, as in real Flux
    out = deep(prompt="a cat", height=40, width=40, num_inference_steps=1).images
    assert [im.size for im in out] == [(32, 32)]  # 40x40 silently becomes 32x32


def test_size_rules_pixart(pipes: dict[str, Any]) -> None:
    pipe = pipes["pixart"]
    # check_inputs hard-codes a multiple of 8 (ValueError), whatever the VAE
    with pytest.raises(ValueError, match="divisible by 8"):
        _call(pipes, "pixart", size=36, steps=1, prompt="a cat")
    assert [im.size for im in _call(pipes, "pixart", size=40, steps=1, prompt="a cat")] == [(40, 40)]
    assert [im.size for im in _call(pipes, "pixart", size=8, steps=1, prompt="a cat")] == [(8, 8)]
    assert pipe.transformer.config.sample_size * pipe.vae_scale_factor == 8  # the default size
    # ... but the latent must also divide by patch_size: with a real VAE (8) and patch 2 the true multiple is 16,
    # and 40x40 passes the check only to fail inside the transformer
    deep = _with_vae(pipe, _deep_vae(4))
    with pytest.raises(RuntimeError):
        deep(prompt="a cat", height=40, width=40, num_inference_steps=1, **CALL_KW["pixart"])
    assert [
        im.size for im in deep(prompt="a cat", height=48, width=48, num_inference_steps=1, **CALL_KW["pixart"]).images
    ] == [(48, 48)]


def test_pixart_resolution_binning(pipes: dict[str, Any]) -> None:
    pipe = pipes["pixart"]
    with pytest.raises(ValueError, match="Invalid sample size"):  # the default, True, on the tiny transformer
        pipe(prompt="a cat", height=32, width=32, num_inference_steps=1, clean_caption=False)
    # on a transformer with a binned sample_size (32 -> the 256px bins), True generates at the bin's resolution
    # and resizes/crops back: the requested size comes back, but it was not generated at that size
    cfg = dict(pipe.transformer.config)
    cfg["sample_size"] = 32
    torch.manual_seed(0)
    binned = type(pipe)(
        **{**pipe.components, "transformer": type(pipe.transformer).from_config(cfg), "vae": _deep_vae(4)}
    )
    binned.set_progress_bar_config(disable=True)
    shapes: list[tuple[int, ...]] = []

    def record(step: int, timestep: int, latents: torch.Tensor) -> None:
        shapes.append(tuple(latents.shape))

    kw = {"prompt": "a cat", "height": 48, "width": 48, "num_inference_steps": 1, "clean_caption": False}
    assert binned(**kw, callback=record).images[0].size == (48, 48)
    assert binned(**kw, callback=record, use_resolution_binning=False).images[0].size == (48, 48)
    assert shapes == [(1, 4, 32, 32), (1, 4, 6, 6)]  # 256x256 vs the requested 48x48 (vae_scale_factor 8)


def test_negative_prompt_semantics(pipes: dict[str, Any]) -> None:
    def img(family: str, **kw: Any) -> np.ndarray:
        return _u8(_call(pipes, family, prompt="a cat", **kw))

    for family in ("sd3", "pixart"):  # used whenever guidance_scale > 1 (the default: 7.0 / 4.5)
        assert (img(family, negative_prompt="dog") != img(family)).any()
        assert (img(family, negative_prompt="dog", guidance_scale=1.0) == img(family, guidance_scale=1.0)).all()
    # Flux: only with true_cfg_scale > 1 AND a negative prompt (two transformer passes per step)
    assert (img("flux", negative_prompt="dog") == img("flux")).all()
    assert (img("flux", true_cfg_scale=2.0) == img("flux")).all()
    assert (img("flux", negative_prompt="dog", true_cfg_scale=2.0) != img("flux")).any()
    # the tiny Flux has no guidance embedding (schnell-like): guidance_scale is ignored
    assert pipes["flux"].transformer.config.guidance_embeds is False
    assert (img("flux", guidance_scale=10.0) == img("flux")).all()


def test_call_signatures(pipes: dict[str, Any]) -> None:
    params = {name: inspect.signature(pipe.__call__).parameters for name, pipe in pipes.items()}
    for family in ("sd3", "flux", "pixart"):
        assert "guidance_rescale" not in params[family]
    # PixArt's __call__ takes **kwargs: unknown arguments (guidance_rescale, callback_on_step_end) are swallowed
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params["pixart"].values())
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params["sd3"].values())
    for family in ("sd3", "flux"):
        with pytest.raises(TypeError, match="guidance_rescale"):
            _call(pipes, family, prompt="a cat", guidance_rescale=0.5)
    _call(pipes, "pixart", prompt="a cat", guidance_rescale=0.5)  # silently ignored
    assert params["sd3"]["max_sequence_length"].default == 256
    assert params["flux"]["max_sequence_length"].default == 512
    assert params["pixart"]["max_sequence_length"].default == 300
    assert params["pixart"]["use_resolution_binning"].default is True
    assert params["pixart"]["negative_prompt"].default == ""


def test_max_sequence_length(pipes: dict[str, Any]) -> None:
    for family in ("sd3_t5", "flux"):  # at most 512 (ValueError above); any smaller value is fine
        with pytest.raises(ValueError, match="cannot be greater than 512"):
            _call(pipes, family, prompt="a cat", max_sequence_length=513)
        assert len(_call(pipes, family, prompt="a cat", max_sequence_length=8)) == 1
    assert len(_call(pipes, "sd3", prompt="a cat", max_sequence_length=8)) == 1  # sizes the zero T5 block
    assert len(_call(pipes, "pixart", prompt="a cat", max_sequence_length=600)) == 1  # no upper bound checked

    # SD3/Flux pad T5 to max_sequence_length with no attention mask (SD3 without T5: zeros of that length), so it
    # changes the image: it belongs in the fusion key. PixArt masks the padding (T5 and cross-attention).
    def img(family: str, length: int) -> np.ndarray:
        return _u8(_call(pipes, family, prompt="a red cat", max_sequence_length=length))

    for family in ("sd3", "sd3_t5", "flux"):
        assert (img(family, 16) != img(family, 64)).any()
    assert np.abs(img("pixart", 16) - img("pixart", 64)).max() <= 1


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_callback_on_step_end_and_interrupt(pipes: dict[str, Any], family: str) -> None:
    steps: list[int] = []

    def stop(pipe: Any, step: int, timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        steps.append(step)
        assert set(tensors) == {"latents"}
        pipe._interrupt = True  # the remaining steps are skipped; the half-denoised latents are still decoded
        return tensors

    images = _call(pipes, family, prompt="a cat", steps=4, callback_on_step_end=stop)
    assert steps == [0] and len(images) == 1
    assert pipes[family].interrupt is True  # reset to False at the start of the next call


def test_pixart_has_only_the_legacy_callback(pipes: dict[str, Any]) -> None:
    pipe = pipes["pixart"]
    assert not hasattr(type(pipe), "interrupt")
    called: list[int] = []
    _call(pipes, "pixart", prompt="a cat", steps=3, callback_on_step_end=lambda *a: called.append(-1))
    assert called == []  # swallowed by **kwargs, never called
    _call(pipes, "pixart", prompt="a cat", steps=3, callback=lambda step, t, latents: called.append(step))
    assert called == [0, 1, 2]


@pytest.mark.parametrize(
    ("family", "img2img", "inpaint"),
    [
        ("sd3", "StableDiffusion3Img2ImgPipeline", "StableDiffusion3InpaintPipeline"),
        ("flux", "FluxImg2ImgPipeline", "FluxInpaintPipeline"),
    ],
)
def test_from_pipe_variants(pipes: dict[str, Any], family: str, img2img: str, inpaint: str) -> None:
    from PIL import Image

    image = Image.new("RGB", (32, 32), (200, 10, 10))
    mask = Image.new("L", (32, 32), 255)
    generator = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    assert_siblings_run(
        pipes[family],
        img2img,
        inpaint,
        image=image,
        mask=mask,
        size=32,
        generator=generator,
        strength=0.6,
        num_inference_steps=3,
    )


def test_pixart_has_no_from_pipe_variants(pipes: dict[str, Any]) -> None:
    for auto in (diffusers.AutoPipelineForImage2Image, diffusers.AutoPipelineForInpainting):
        with pytest.raises(ValueError, match="can't find a pipeline"):
            auto.from_pipe(pipes["pixart"])


@pytest.mark.parametrize("family", ["sd3", "flux", "pixart"])
def test_generator_semantics(pipes: dict[str, Any], family: str) -> None:
    prompts = PROMPTS[:2]
    with pytest.raises(ValueError, match="list of generators of length 3"):  # must be batch * n long
        _call(pipes, family, prompt=prompts, generator=_gens([1, 2, 3]))
    per_image = _u8(_call(pipes, family, prompt=prompts, generator=_gens([1, 2])))
    # one shared generator is drawn from sequentially across the batch: image 0 matches, image 1 does not
    shared = _u8(_call(pipes, family, prompt=prompts, generator=torch.Generator().manual_seed(1)))
    assert (shared[0] == per_image[0]).all() and (shared[1] != per_image[1]).any()
    # a one-element list behaves as the bare generator
    single = _u8(_call(pipes, family, prompt=prompts[0], generator=_gens([1])))
    assert (single[0] == per_image[0]).all()
