"""The built-in demo models: tiny, randomly initialised pipelines built offline, one per pipeline family.

The default is a Stable Diffusion 1.x pipeline with diffusers' own test-suite component sizes (~1M UNet
parameters, ~4 MB on disk), so a worker can serve real pipeline calls on a laptop CPU without downloading
anything; ``FUSEFLEET_DEMO_FAMILY`` picks another family's tiny pipeline (``DEMO_FAMILIES``, built by
``gpu_worker/tiny_models/``). Weights come from a fixed torch seed: every process builds byte-identical weights.
Images are noise-like, but fused, seeded and LoRA behaviour is real.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

DEMO_MODEL_NAME = "demo"
"""The ``RequestSpec.model`` value that selects the demo model."""

DEMO_MODEL_DIRNAME = "demo-sd-v1"
DEFAULT_DEMO_FAMILY = "stable-diffusion"
DEMO_FAMILIES: dict[str, str] = {
    "stable-diffusion": "gpu_worker.demo_model:build_demo_pipeline",
    "stable-diffusion-xl": "gpu_worker.tiny_models.sdxl:build",
    "stable-diffusion-3": "gpu_worker.tiny_models.sd3:build",
    "flux": "gpu_worker.tiny_models.flux:build",
    "pixart": "gpu_worker.tiny_models.pixart:build",
    "sana": "gpu_worker.tiny_models.sana:build",
    "qwen-image": "gpu_worker.tiny_models.qwen_image:build",
    "ltx-video": "gpu_worker.tiny_models.video:build",
}
"""Family name (as ``gpu_worker.families`` names it) -> 'module:function' building its tiny pipeline."""
_MARKER = "model_index.json"
_SEED = 0
_SPECIAL_TOKENS = ("<|startoftext|>", "<|endoftext|>")  # ids 0 (bos) and 1 (eos = pad)
_WORDS = (
    "a photo of the cat dog red blue green sky sea tree house car portrait painting mountain forest city "
    "night day sun moon flower bird fish river in on with and style art"
).split()
_VOCAB_SIZE = 1000


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the byte-level alphabet of CLIP's BPE)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def build_demo_tokenizer_data() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocab and merges of a tiny byte-level CLIP BPE: specials, 2x256 byte chars, pieces of a few words."""
    alphabet = list(_bytes_to_unicode().values())
    tokens = [*_SPECIAL_TOKENS, *alphabet, *(c + "</w>" for c in alphabet)]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges: list[tuple[str, str]] = []
    for word in _WORDS:
        symbols = [*word[:-1], word[-1] + "</w>"]
        piece = symbols[0]
        for sym in symbols[1:]:
            merged = piece + sym
            if merged not in vocab:
                merges.append((piece, sym))
                vocab[merged] = len(vocab)
            piece = merged
    assert len(vocab) <= _VOCAB_SIZE, "demo tokenizer vocab must fit the text encoder's embedding table"
    return vocab, merges


def sd_scheduler() -> Any:
    """Stable Diffusion 1.x's DDIM schedule (scaled-linear betas 0.00085..0.012, steps offset 1)."""
    from diffusers import DDIMScheduler

    return DDIMScheduler(  # type: ignore[no-untyped-call]
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )


def build_demo_pipeline() -> object:
    """A fresh tiny StableDiffusionPipeline with seeded random weights (not saved)."""
    from diffusers import AutoencoderKL, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    torch.manual_seed(_SEED)
    unet = UNet2DConditionModel(  # type: ignore[no-untyped-call]
        block_out_channels=(32, 64),
        layers_per_block=1,
        sample_size=32,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        norm_num_groups=2,
    )
    torch.manual_seed(_SEED)
    vae = AutoencoderKL(  # type: ignore[no-untyped-call]
        block_out_channels=[4, 8],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
        up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"],
        latent_channels=4,
        norm_num_groups=2,
    )
    torch.manual_seed(_SEED)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
            hidden_size=32,
            intermediate_size=37,
            layer_norm_eps=1e-05,
            num_attention_heads=4,
            num_hidden_layers=5,
            vocab_size=_VOCAB_SIZE,
            max_position_embeddings=77,
        )
    )
    vocab, merges = build_demo_tokenizer_data()
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)  # type: ignore[arg-type]
    return StableDiffusionPipeline(  # type: ignore[no-untyped-call]
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=sd_scheduler(),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def demo_builder(family: str) -> Callable[[], Any]:
    """The function that builds ``family``'s tiny pipeline; ValueError listing the families when unknown."""
    try:
        module_name, _, function = DEMO_FAMILIES[family].partition(":")
    except KeyError:
        known = ", ".join(sorted(DEMO_FAMILIES))
        raise ValueError(f"unknown demo family {family!r} (FUSEFLEET_DEMO_FAMILY); known: {known}") from None
    builder: Callable[[], Any] = getattr(importlib.import_module(module_name), function)
    return builder


def ensure_demo_model(cache_dir: Path, family: str = DEFAULT_DEMO_FAMILY) -> Path:
    """Return the folder of ``family``'s demo pipeline under ``cache_dir`` (``demo-sd-v1`` for the default,
    ``demo-<family>`` otherwise), building and saving it there first if it is missing.

    Idempotent and safe across processes: the model is saved into a temporary sibling folder and renamed into
    place; when another process won the race, its copy (identical bytes) is kept and ours discarded.
    """
    build = demo_builder(family)
    dirname = DEMO_MODEL_DIRNAME if family == DEFAULT_DEMO_FAMILY else f"demo-{family}"
    target = Path(cache_dir) / dirname
    if (target / _MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dirname}-", dir=target.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared by the workers of a host
        pipe = build()
        pipe.save_pretrained(tmp, safe_serialization=True)
        try:
            os.rename(tmp, target)
        except OSError:
            # Target exists: a concurrent builder finished first (or a stale partial dir without the marker).
            if not (target / _MARKER).is_file():
                shutil.rmtree(target, ignore_errors=True)
                os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
