"""Images in and out of ``fusefleet.client``: ``encode_image`` for image-conditioned requests, results -> PIL.

Pillow is optional for the client: only ``to_pil`` (and ``encode_image`` of a PIL image, or of a format other
than PNG, JPEG and WebP) need it, and it is imported on first use.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from PIL import Image as PILImage

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PILLOW_HINT = "pip install pillow (Pillow also comes with fusefleet's `worker` extra)"


@runtime_checkable
class _SavesImages(Protocol):
    """What a PIL image offers that ``encode_image`` uses (checked without importing Pillow)."""

    def save(self, fp: Any, format: str | None = None, **params: Any) -> None: ...


ImageSource = str | os.PathLike[str] | bytes | bytearray | memoryview | IO[bytes] | _SavesImages
"""A path, encoded image bytes, a binary file object, or a PIL image."""


def pillow(feature: str) -> ModuleType:
    """``PIL.Image``, or an ImportError that says which feature needs Pillow and how to get it."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError(f"{feature} needs Pillow, which is not installed: {PILLOW_HINT}") from exc
    return Image


def sniff_mime(data: bytes) -> str | None:
    """``image/png``, ``image/jpeg`` or ``image/webp`` from the first bytes; None for anything else."""
    if data.startswith(PNG_MAGIC):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _png_of(image: _SavesImages) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _reencoded_as_png(data: bytes) -> bytes:
    Image = pillow("encode_image() of an image that is not PNG, JPEG or WebP")
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            converted = image.convert("RGBA" if "A" in image.getbands() else "RGB")
    except (OSError, ValueError) as exc:
        raise ValueError(f"encode_image(): not a readable image ({type(exc).__name__}: {exc})") from None
    return _png_of(converted)


def encode_image(source: ImageSource, *, data_url: bool = False) -> str:
    """Base64 of an image, for ``GenerateRequest(image=..., mask_image=...)``.

    ``source`` is a path, the encoded bytes of a PNG, JPEG or WebP, a binary file object, or a PIL image (sent as
    PNG). Other formats are re-encoded as PNG (that needs Pillow). A ``data:`` URL string is returned unchanged.
    With ``data_url=True`` the answer is a ``data:image/...;base64,`` URL instead of plain base64.

    >>> GenerateRequest(prompt="a watercolour fox", image=encode_image("in.png"), strength=0.6)  # doctest: +SKIP
    """
    if isinstance(source, str) and source.startswith("data:"):
        return source
    if isinstance(source, str | os.PathLike):
        data = Path(source).read_bytes()
    elif isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
    elif isinstance(source, _SavesImages) and not hasattr(source, "read"):
        data = _png_of(source)
    elif hasattr(source, "read"):
        data = source.read()
        if not isinstance(data, bytes):
            raise TypeError("encode_image(): the file object must be opened in binary mode ('rb')")
    else:
        raise TypeError(f"encode_image(): expected a path, bytes, a binary file or a PIL image, not {type(source)}")
    if not data:
        raise ValueError("encode_image(): the image is empty")
    mime = sniff_mime(data)
    if mime is None:
        data = _reencoded_as_png(data)
        mime = "image/png"
    encoded = base64.b64encode(data).decode("ascii")
    return f"data:{mime};base64,{encoded}" if data_url else encoded


def to_pil(images: Sequence[bytes]) -> list[PILImage.Image]:
    """PIL images of encoded image bytes (PNG, JPEG or WebP; fully loaded). Needs Pillow (imported on first use)."""
    Image = pillow("Result.pil_images()")
    out: list[PILImage.Image] = []
    for data in images:
        image = Image.open(io.BytesIO(data))
        image.load()
        out.append(image)
    return out
