"""What the tiny pipelines share: their seed, the JSON files of their sizes, diffusers' tiny CLIP and T5 text
encoders and flow-matching VAE (``components.json``), and eval mode.

Every module is built right after ``torch.manual_seed(SEED)`` (:func:`seeded`), so every process builds identical
weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from demo_models.tokenizers import vocab_size

SEED = 0
T = TypeVar("T")


def sizes(module_file: str) -> dict[str, Any]:
    """The sizes of a tiny pipeline's components: the JSON file beside ``module_file`` (a module's ``__file__``),
    component name -> its constructor's keywords."""
    sized: dict[str, Any] = json.loads(Path(module_file).with_suffix(".json").read_text())
    return sized


_SHARED = sizes(__file__)


def seeded(build: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``build(*args, **kwargs)`` right after ``torch.manual_seed(SEED)``: the same weights in every process."""
    torch.manual_seed(SEED)
    return build(*args, **kwargs)


def eval_modules(pipe: Any) -> Any:
    """Put every torch module of ``pipe`` in eval mode (freshly built models start in training mode, where T5's
    dropout would make outputs random) and return ``pipe``; ``from_pretrained`` does the same on load."""
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            component.eval()
    return pipe


def clip_text_config(vocab_rows: int, **extra: Any) -> Any:
    """diffusers' tiny CLIP text-encoder config (hidden 32, 5 layers, 4 heads; bos 0, eos = pad 1, the ids of
    :func:`demo_models.tokenizers.clip_tokenizer`) with ``vocab_rows`` embedding rows, and ``extra``."""
    from transformers import CLIPTextConfig

    return CLIPTextConfig(**_SHARED["clip_text"], vocab_size=vocab_rows, **extra)


def clip_text_encoder(model_class: Callable[[Any], T], tokenizer: Any) -> T:
    """A seeded ``model_class`` (``CLIPTextModel`` or ``CLIPTextModelWithProjection``) of the CLIP of diffusers'
    SDXL, SD3 and Flux tests (gelu, projection 32), sized to ``tokenizer``."""
    config = clip_text_config(vocab_size(tokenizer), **_SHARED["clip_text_with_projection"])
    return seeded(model_class, config)


def t5_encoder(tokenizer: Any) -> Any:
    """A T5 encoder of ``hf-internal-testing/tiny-random-t5``'s sizes (d_model 32), seeded."""
    from transformers import T5Config, T5EncoderModel

    return seeded(T5EncoderModel, T5Config(vocab_size=vocab_size(tokenizer), **_SHARED["t5_encoder"]))


def umt5_encoder(tokenizer: Any) -> Any:
    """A UMT5 encoder (Wan's: T5 with a relative attention bias in every layer) of :func:`t5_encoder`'s sizes,
    seeded."""
    from transformers import UMT5Config, UMT5EncoderModel

    return seeded(UMT5EncoderModel, UMT5Config(vocab_size=vocab_size(tokenizer), **_SHARED["t5_encoder"]))


def flow_vae(latent_channels: int) -> Any:
    """diffusers' tiny ``AutoencoderKL`` of its SD3 and Flux tests (one block of 4 channels, no quant convs, SD3's
    shift and scaling factors), seeded."""
    from diffusers import AutoencoderKL

    return seeded(AutoencoderKL, latent_channels=latent_channels, **_SHARED["flow_vae"])


def flow_scheduler(**config: Any) -> Any:
    """A ``FlowMatchEulerDiscreteScheduler`` of ``config`` (its defaults where none: the SD3, Flux, Qwen-Image and
    LTX tests'; Sana's shifts by 7)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(**config)  # type: ignore[no-untyped-call]
