"""What the tiny video pipelines' unit tests share (tests/unit/test_tiny_video.py, test_tiny_wan.py): a pipeline
saved and loaded back as a worker loads it, its videos' frames as pixel arrays, one generator per video, and the
prompts a fused call and its solo calls run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

PROMPTS = ["a red fox", "a blue whale in the sea at night", "lighthouse"]
"""Prompts of different token lengths, so a fused call pads them as its solo calls do not."""
NEGATIVES = ["blurry", "", "a dog"]
SEEDS = [11, 22, 33]


def loaded_back(build: Callable[[], Any], folder: Path) -> Any:
    """``build()`` saved into ``folder`` and loaded back with ``DiffusionPipeline.from_pretrained``, quiet."""
    from diffusers import DiffusionPipeline

    build().save_pretrained(folder)
    loaded = DiffusionPipeline.from_pretrained(folder)  # type: ignore[no-untyped-call]
    loaded.set_progress_bar_config(disable=True)
    return loaded


def frames_of(out: Any) -> list[list[Image.Image]]:
    """A video pipeline's output as one list of PIL frames per video."""
    frames: list[list[Image.Image]] = out.frames
    return frames


def pixels(frames: Sequence[Image.Image]) -> np.ndarray:
    """One video's frames as an int16 array (frames, height, width, 3)."""
    return np.stack([np.asarray(frame, dtype=np.int16) for frame in frames])


def generators(seeds: Sequence[int]) -> list[torch.Generator]:
    """One CPU generator per video, seeded."""
    return [torch.Generator().manual_seed(seed) for seed in seeds]
