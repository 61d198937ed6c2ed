"""Encoding pipeline outputs for storage."""

from __future__ import annotations

import io

from PIL import Image


def to_png(image: Image.Image) -> bytes:
    """PNG bytes of ``image`` (fast, lossless compression: the bytes are short-lived results)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()
