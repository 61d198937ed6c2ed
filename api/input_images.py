"""Input images of image-conditioned requests: decoded, checked and normalised once, at the api.

A request's ``image`` (and ``mask_image``) arrive as base64 PNG, JPEG or WebP, or as a ``data:`` URL. Each is
decoded, checked against the fleet's limits (``max_input_image_bytes``, ``max_input_image_pixels``) and stored in
the request's hash (no message ever carries the bytes), in the most compact form that gives the worker exactly the
conditioning it runs with:

- already the request's ``width`` x ``height``: the client's own bytes. The worker decodes and converts them as this
  module does (``gpu_worker.executor.decode_inputs``: RGB; the mask 8-bit grey, white = repaint), so it gets the
  same pixels, and a JPEG is not inflated into a PNG (a 2048² photo: 440 KB, not 4.1 MB);
- another size: converted, resized to it (Lanczos: the worker runs at that size, so it would resize anyway) and
  stored as PNG (lossless).

What is stored counts against the input budget until the request ends (``api.input_budget``). Problems are
reported in the api's 422 format, naming the field.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from api.limits import ErrorDict, Loc
from shared.settings import Settings
from shared.wire import GenerateRequest

ACCEPTED_FORMATS = frozenset({"PNG", "JPEG", "WEBP"})
_DATA_URL = re.compile(r"^data:(?P<mime>[\w/+.-]*)(;[\w=.-]+)*;base64,", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class StoredInputs:
    """The bytes stored with a request (its own file, or a PNG at its size): its image, and its mask for
    inpainting."""

    @property
    def size(self) -> int:
        """Bytes these inputs hold in Redis (what ``submit.lua`` counts against the input budget)."""
        return len(self.image) + len(self.mask or b"")

    image: bytes
    mask: bytes | None = None


class InputImageError(ValueError):
    """An input image that cannot be used; ``str()`` says why, for the field's 422."""


def decode_base64(value: str) -> bytes:
    """The bytes of a base64 string or a ``data:...;base64,`` URL."""
    text = _DATA_URL.sub("", value.strip(), count=1)
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InputImageError("is not valid base64 (nor a data: URL with base64 content)") from None


def normalise(data: bytes, width: int, height: int, *, mask: bool, settings: Settings) -> bytes:
    """The bytes to store of ``data``, an RGB image (or an 8-bit mask) for a ``width`` x ``height`` request:
    ``data`` itself when it decodes fine at that size, else a PNG of it converted and resized to it."""
    if len(data) > settings.max_input_image_bytes:
        raise InputImageError(
            f"is {len(data)} bytes; this server's max_input_image_bytes is {settings.max_input_image_bytes}"
        )
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format not in ACCEPTED_FORMATS:
                raise InputImageError(f"is {image.format}; send PNG, JPEG or WebP")
            pixels = image.width * image.height
            if pixels > settings.max_input_image_pixels:
                raise InputImageError(
                    f"is {image.width}x{image.height} = {pixels} pixels; this server's max_input_image_pixels is "
                    f"{settings.max_input_image_pixels}"
                )
            converted = image.convert("L" if mask else "RGB")
    except InputImageError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InputImageError(f"could not be decoded as an image ({type(exc).__name__}: {exc})") from None
    if converted.size == (width, height):
        return data  # decoded in full above: the worker's decode of these bytes gives the same pixels
    buffer = io.BytesIO()
    converted.resize((width, height), Image.Resampling.LANCZOS).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def _field_error(loc: Loc, field: str, problem: str) -> ErrorDict:
    return {
        "type": "input_image_invalid",
        "loc": (*loc, field),
        "msg": f"{field} {problem}",
        "input": f"<{field}>",  # never echo megabytes of base64
    }


def prepare_inputs(request: GenerateRequest, settings: Settings, loc: Loc = ("body",)) -> tuple[
    StoredInputs | None, list[ErrorDict]
]:
    """The stored inputs of ``request`` (None for text-to-image), or the 422 errors that refuse it.

    CPU-bound (decoding, resizing, encoding): call it off the event loop.
    """
    if request.image is None:
        return None, []
    encoded: dict[str, bytes] = {}
    errors: list[ErrorDict] = []
    for field, value, is_mask in (("image", request.image, False), ("mask_image", request.mask_image, True)):
        if value is None:
            continue
        try:
            encoded[field] = normalise(
                decode_base64(value), request.width, request.height, mask=is_mask, settings=settings
            )
        except InputImageError as exc:
            errors.append(_field_error(loc, field, str(exc)))
    if errors:
        return None, errors
    return StoredInputs(image=encoded["image"], mask=encoded.get("mask_image")), []
