"""Request bounds that depend on the fleet's ``Settings``, reported like pydantic's own validation errors.

Each error is a dict in FastAPI's 422 ``detail`` format (``type``, ``loc``, ``msg``, ``input``, ``ctx``), with
``loc`` under the caller's prefix, e.g. ``("body", "width")`` or ``("body", "requests", 3, "width")``.
"""

from __future__ import annotations

from typing import Any

from shared.compat import output_pixels
from shared.settings import Settings
from shared.wire import GenerateRequest

Loc = tuple[str | int, ...]
ErrorDict = dict[str, Any]


def _too_long(loc: Loc, value: str, limit: int, setting: str) -> ErrorDict:
    return {
        "type": "string_too_long",
        "loc": loc,
        "msg": f"String should have at most {limit} characters (this server's {setting})",
        "input": value,
        "ctx": {"max_length": limit},
    }


def _too_large(loc: Loc, value: float, limit: float, setting: str) -> ErrorDict:
    return {
        "type": "less_than_equal",
        "loc": loc,
        "msg": f"Input should be less than or equal to {limit} (this server's {setting})",
        "input": value,
        "ctx": {"le": limit},
    }


def limit_errors(request: GenerateRequest, settings: Settings, loc: Loc = ("body",)) -> list[ErrorDict]:
    """Every way ``request`` exceeds the limits of ``settings``; empty when it is acceptable."""
    errors: list[ErrorDict] = []
    max_chars = settings.max_prompt_chars
    for field in ("prompt", "negative_prompt"):
        text: str | None = getattr(request, field)
        if text is not None and len(text) > max_chars:
            errors.append(_too_long((*loc, field), text, max_chars, "max_prompt_chars"))
    sizes_ok = True
    for field in ("width", "height"):
        side: int = getattr(request, field)
        if side > settings.max_image_side:
            errors.append(_too_large((*loc, field), side, settings.max_image_side, "max_image_side"))
            sizes_ok = False
    if request.num_inference_steps > settings.max_inference_steps:
        errors.append(
            _too_large(
                (*loc, "num_inference_steps"),
                request.num_inference_steps,
                settings.max_inference_steps,
                "max_inference_steps",
            )
        )
    if request.num_frames is not None and request.num_frames > settings.max_num_frames:
        errors.append(
            _too_large((*loc, "num_frames"), request.num_frames, settings.max_num_frames, "max_num_frames")
        )
        sizes_ok = False
    if request.n > settings.max_images_per_request:
        errors.append(_too_large((*loc, "n"), request.n, settings.max_images_per_request, "max_images_per_request"))
        sizes_ok = False
    if request.timeout_s is not None and request.timeout_s > settings.max_timeout_s:
        errors.append(_too_large((*loc, "timeout_s"), request.timeout_s, settings.max_timeout_s, "max_timeout_s"))
    if sizes_ok:  # the budget is about the combination; an oversized field is reported once, by its own limit
        errors += _pixel_budget_errors(request, settings, loc)
    if request.lora is not None:
        name = request.lora.name
        if settings.lora_dir is None or not (settings.lora_dir / name).is_dir():
            where = "no LoRA folder is configured" if settings.lora_dir is None else "not in the LoRA folder"
            errors.append(
                {
                    "type": "lora_not_found",
                    "loc": (*loc, "lora", "name"),
                    "msg": f"Unknown LoRA adapter {name!r} ({where})",
                    "input": name,
                }
            )
    return errors


def _pixel_budget_errors(request: GenerateRequest, settings: Settings, loc: Loc) -> list[ErrorDict]:
    """The request alone exceeds the per-batch pixel budget: no batch could ever run it.

    Named at ``width`` for a single image, at ``n`` otherwise (fewer images is then the likely fix).
    """
    pixels = output_pixels(request.n, request.width, request.height, request.num_frames)
    limit = settings.max_batch_pixels
    if pixels <= limit:
        return []
    field = "width" if request.n == 1 else "n"
    frames_term, frames = (" x num_frames", f" x {request.num_frames}") if request.num_frames else ("", "")
    return [
        {
            "type": "batch_pixels_exceeded",
            "loc": (*loc, field),
            "msg": f"n x width x height{frames_term} = {request.n} x {request.width} x {request.height}{frames} = "
            f"{pixels} pixels exceeds this server's max_batch_pixels ({limit})",
            "input": getattr(request, field),
            "ctx": {"pixels": pixels, "max_batch_pixels": limit},
        }
    ]
