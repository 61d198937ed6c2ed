"""Test LoRA adapters built in code for the tiny demo model (nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

import torch

LORA_TARGET_MODULES = ["to_q", "to_k", "to_v", "to_out.0"]


def make_test_lora(model_dir: Path, out_dir: Path, name: str, seed: int) -> Path:
    """Save a random rank-4 UNet LoRA for the pipeline at ``model_dir`` into ``out_dir/name``; return it.

    ``init_lora_weights=False`` gives both LoRA matrices random values, so the adapter really changes the
    output (peft's default init zeroes one of them, making a fresh adapter a no-op). Seeded: same seed, same
    bytes.
    """
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    unet = UNet2DConditionModel.from_pretrained(Path(model_dir) / "unet")
    config = LoraConfig(r=4, lora_alpha=4, init_lora_weights=False, target_modules=LORA_TARGET_MODULES)
    torch.manual_seed(seed)
    unet.add_adapter(config, adapter_name="made")  # not ``name``: peft refuses adapter names with dots
    layers = convert_state_dict_to_diffusers(get_peft_model_state_dict(unet, adapter_name="made"))
    target = Path(out_dir) / name
    StableDiffusionPipeline.save_lora_weights(target, unet_lora_layers=layers)
    return target


def make_family_lora(model_dir: Path, out_dir: Path, name: str, seed: int) -> Path:
    """Like ``make_test_lora`` for any family's saved pipeline: a random rank-4 LoRA on its denoiser's attention
    projections (``unet`` or ``transformer``), saved with the pipeline class's own ``save_lora_weights``."""
    import diffusers
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    index = diffusers.DiffusionPipeline.load_config(model_dir)
    pipeline_class = getattr(diffusers, index["_class_name"])
    denoiser_name = "unet" if "unet" in index else "transformer"
    _, class_name = index[denoiser_name]
    denoiser = getattr(diffusers, class_name).from_pretrained(Path(model_dir) / denoiser_name)
    config = LoraConfig(r=4, lora_alpha=4, init_lora_weights=False, target_modules=LORA_TARGET_MODULES)
    torch.manual_seed(seed)
    denoiser.add_adapter(config, adapter_name=name)
    layers = convert_state_dict_to_diffusers(get_peft_model_state_dict(denoiser, adapter_name=name))
    target = Path(out_dir) / name
    pipeline_class.save_lora_weights(target, **{f"{denoiser_name}_lora_layers": layers})
    return target
