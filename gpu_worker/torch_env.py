"""Torch placement and seeding shared by the runner and the step engine: the device and dtype a worker's settings
name, and the per-output generators that make each output of a fused batch equal its solo run."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shared.contracts import RequestSpec

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; anything else is passed to torch.device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """'auto' -> float16 on cuda, float32 elsewhere; else one of float32, float16, bfloat16."""
    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown torch_dtype {name!r}; expected 'auto' or one of {sorted(_DTYPES)}") from None


def make_generators(specs: Sequence[RequestSpec], device: torch.device | str) -> list[torch.Generator]:
    """One generator per output image, in output order: image ``k`` of a spec is seeded ``spec.seed + k``."""
    return [torch.Generator(device).manual_seed(spec.seed + k) for spec in specs for k in range(spec.n)]
