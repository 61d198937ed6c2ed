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


BOUNDS = {
    "width": "max_image_side",
    "height": "max_image_side",
    "num_inference_steps": "max_inference_steps",
    "num_frames": "max_num_frames",
    "n": "max_images_per_request",
    "timeout_s": "max_timeout_s",
}
"""Numeric field -> the setting it may not exceed, in the order their errors are reported."""
SIZE_FIELDS = frozenset({"width", "height", "num_frames", "n"})
"""The fields of the pixel budget: one over its own bound is not reported again by the budget."""


def _exceeded(loc: Loc, value: str | float, setting: str, limit: float) -> ErrorDict:
    """Pydantic's error for ``value`` past this server's ``setting``: a string's length, or a number."""
    if isinstance(value, str):
        kind, msg, ctx = "string_too_long", f"String should have at most {limit} characters", "max_length"
    else:
        kind, msg, ctx = "less_than_equal", f"Input should be less than or equal to {limit}", "le"
    return {"type": kind, "loc": loc, "msg": f"{msg} (this server's {setting})", "input": value, "ctx": {ctx: limit}}


def request_model(request: GenerateRequest, settings: Settings) -> str:
    """The model ``request`` is for: the one it names, or the fleet's default."""
    return request.model or settings.model_id


def limit_errors(request: GenerateRequest, settings: Settings, loc: Loc = ("body",)) -> list[ErrorDict]:
    """Every way ``request`` exceeds the limits of ``settings``; empty when it is acceptable."""
    errors: list[ErrorDict] = []
    max_chars = settings.max_prompt_chars
    for field in ("prompt", "negative_prompt"):
        text: str | None = getattr(request, field)
        if text is not None and len(text) > max_chars:
            errors.append(_exceeded((*loc, field), text, "max_prompt_chars", max_chars))
    sizes_ok = True
    for field, setting in BOUNDS.items():
        value: float | None = getattr(request, field)
        limit: float = getattr(settings, setting)
        if value is not None and value > limit:
            errors.append(_exceeded((*loc, field), value, setting, limit))
            sizes_ok = sizes_ok and field not in SIZE_FIELDS
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
    """The request alone exceeds the per-batch pixel budget of its model (its own ``max_batch_pixels`` where the
    config file gives it one, else the fleet's): no batch could ever run it.

    Named at ``width`` for a single image, at ``n`` otherwise (fewer images is then the likely fix).
    """
    pixels = output_pixels(request.n, request.width, request.height, request.num_frames)
    limit = settings.batching_for(request_model(request, settings)).max_batch_pixels
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
