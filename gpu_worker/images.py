"""Encoding pipeline outputs in the format each request asked for."""

from __future__ import annotations

import io

from PIL import Image

from shared.contracts import OutputFormat

DEFAULT_QUALITY = 90  # JPEG and WebP when a request sets no output_compression


def encode(image: Image.Image, output_format: OutputFormat = OutputFormat.PNG, quality: int | None = None) -> bytes:
    """``image`` as ``output_format`` bytes. PNG is lossless with fast compression (``quality`` does not apply);
    JPEG and WebP use ``quality`` (0-100, default ``DEFAULT_QUALITY``)."""
    buffer = io.BytesIO()
    if output_format is OutputFormat.PNG:
        image.save(buffer, format="PNG", compress_level=1)
    else:
        rgb = image if image.mode in ("RGB", "L") else image.convert("RGB")
        rgb.save(buffer, format=output_format.value.upper(), quality=DEFAULT_QUALITY if quality is None else quality)
    return buffer.getvalue()
