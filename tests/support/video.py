"""What the video tests share: a native video request's body (with its first frame for image-to-video), a smooth
random picture to condition on, and a stored video's frames as pixel arrays."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
from PIL import Image

from gpu_worker.video import decode_mp4

SIDE, FRAMES, STEPS, FPS = 32, 9, 2, 8
"""The tiny video tests' clip: 32x32 (LTX's size multiple, twice Wan's), 9 frames (8k + 1 and 4k + 1), 2 steps at
8 fps."""


def picture(seed: int, size: int = SIDE) -> Image.Image:
    """A smooth random RGB picture (distinct per seed)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
    return Image.fromarray(small).resize((size, size), Image.Resampling.BILINEAR)


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def video_body(
    prompt: str, seed: int, image: Image.Image | None = None, frames: int = FRAMES, **extra: Any
) -> dict[str, Any]:
    """A native request for a ``SIDE`` square clip of ``frames`` at ``FPS``, ``STEPS`` steps; ``image`` (base64
    PNG): image-to-video, its first frame."""
    body: dict[str, Any] = {
        "prompt": prompt,
        "seed": seed,
        "width": SIDE,
        "height": SIDE,
        "num_frames": frames,
        "fps": FPS,
        "num_inference_steps": STEPS,
        "guidance_scale": 3.0,
        **extra,
    }
    if image is not None:
        body["image"] = base64.b64encode(png_bytes(image)).decode()
    return body


def mp4_frames(data: bytes) -> np.ndarray:
    """The frames of an MP4 as one int16 array (frames, height, width, 3)."""
    return np.stack([np.asarray(frame.convert("RGB"), dtype=np.int16) for frame in decode_mp4(data)])
