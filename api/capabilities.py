"""Refusing up front a model the fleet does not have, and what a model cannot do, from what its live workers announce.

A request names its model (``model``; unset = the fleet's default, ``Settings.model_id``). A name that is not one of
the fleet's models (``Settings.catalog``) is refused with a 422 naming ``model`` (a model of the fleet that no live
worker serves yet is accepted: it waits for one, as every request waits while no worker is up). Each worker
announces, per model it serves, the model's ``ModelTraits`` and tasks with its heartbeat (``P:capabilities``,
``WorkerCapabilities.served``). A request that asks for what its model does not take — a size that is not a
multiple of its patch size, a negative prompt a guidance-distilled model would ignore, frames for an image model, a
task its family has no pipeline for, more steps than its scheduler sets timesteps for (``gpu_worker.step_limit``), a
``strength`` for a video model's image (its first frame) — is refused with a 422 naming the field, instead of
failing (or silently doing something else) on a worker. Only the workers of the request's model count: nothing is
refused while none of them has announced itself, and where they differ a request is accepted when any of them can
run it.
"""

from __future__ import annotations

from collections.abc import Sequence

from api.limits import ErrorDict, Loc, request_model
from shared.contracts import ModelCapabilities, ModelTraits, WorkerCapabilities
from shared.settings import Settings
from shared.wire import GenerateRequest


def _error(kind: str, loc: Loc, field: str, message: str, value: object) -> ErrorDict:
    return {"type": kind, "loc": (*loc, field), "msg": message, "input": value}


def trait_errors(request: GenerateRequest, traits: ModelTraits, model: str, loc: Loc) -> list[ErrorDict]:
    """Every parameter of ``request`` the model with ``traits`` does not take."""
    name = f"this fleet's model ({model}, {traits.family})"
    errors: list[ErrorDict] = []
    for side in ("width", "height"):
        value: int = getattr(request, side)
        if value % traits.size_multiple:
            message = f"{side} must be a multiple of {traits.size_multiple} for {name}"
            errors.append(_error("size_multiple", loc, side, message, value))
    true_cfg = traits.true_cfg_scale and (request.true_cfg_scale or 0.0) > 1.0
    if request.negative_prompt is not None and not (traits.negative_prompt or true_cfg):
        why = "unless true_cfg_scale > 1" if traits.true_cfg_scale else "(it is guidance-distilled)"
        message = f"{name} ignores negative_prompt {why}"
        errors.append(_error("negative_prompt_ignored", loc, "negative_prompt", message, request.negative_prompt))
    if request.guidance_rescale and not traits.guidance_rescale:
        message = f"{name} does not take guidance_rescale; leave it 0"
        errors.append(_error("parameter_unsupported", loc, "guidance_rescale", message, request.guidance_rescale))
    if request.true_cfg_scale is not None and not traits.true_cfg_scale:
        message = f"{name} does not take true_cfg_scale (guidance_scale sets the guidance)"
        errors.append(_error("parameter_unsupported", loc, "true_cfg_scale", message, request.true_cfg_scale))
    length = request.max_sequence_length
    if length is not None and traits.max_sequence_length is None:
        message = f"{name} does not take max_sequence_length (its text encoder has a fixed length)"
        errors.append(_error("parameter_unsupported", loc, "max_sequence_length", message, length))
    elif length is not None and traits.max_sequence_length is not None and length > traits.max_sequence_length:
        message = f"max_sequence_length must be at most {traits.max_sequence_length} for {name}"
        errors.append(_error("less_than_equal", loc, "max_sequence_length", message, length))
    most = traits.max_inference_steps
    if most is not None and request.num_inference_steps > most:
        message = f"num_inference_steps must be at most {most} for {name}: its scheduler runs no more steps"
        errors.append(_error("less_than_equal", loc, "num_inference_steps", message, request.num_inference_steps))
    if request.lora is not None and not traits.lora:
        message = f"{name} does not take LoRA adapters"
        errors.append(_error("parameter_unsupported", loc, "lora", message, request.lora.name))
    errors += _frame_errors(request, traits, name, loc)
    return errors


def _frame_errors(request: GenerateRequest, traits: ModelTraits, name: str, loc: Loc) -> list[ErrorDict]:
    errors: list[ErrorDict] = []
    if not traits.video:
        for field in ("num_frames", "fps"):
            value = getattr(request, field)
            if value is not None:
                errors.append(_error("video_only", loc, field, f"{name} makes images, not videos", value))
        return errors
    step = traits.frames_multiple
    if request.num_frames is not None and step > 1 and request.num_frames % step != 1:
        message = f"num_frames must be {step}k + 1 (e.g. {step + 1}, {2 * step + 1}) for {name}"
        errors.append(_error("frame_count", loc, "num_frames", message, request.num_frames))
    if request.strength is not None:  # a video model's image task is image-to-video
        message = f"{name} takes an image as a video's first frame, with no strength; leave it unset"
        errors.append(_error("parameter_unsupported", loc, "strength", message, request.strength))
    return errors


DECODED_BYTES_PER_PIXEL = 3 * 4
"""Bytes of one decoded video pixel: 3 channels of float32, as the VAE returns frames."""


def decode_errors(request: GenerateRequest, traits: ModelTraits, limit: int, loc: Loc) -> list[ErrorDict]:
    """A video request whose decoded clip (``DECODED_BYTES_PER_PIXEL`` per pixel of its n clips, at its num_frames or
    the model's default) would exceed ``limit`` (``max_video_decode_bytes``): refused, naming num_frames."""
    if not traits.video:
        return []
    frames = request.num_frames or traits.default_frames or 1
    decoded = request.n * frames * request.width * request.height * DECODED_BYTES_PER_PIXEL
    if decoded <= limit:
        return []
    message = (
        f"n x num_frames x width x height x {DECODED_BYTES_PER_PIXEL} bytes = {request.n} x {frames} x {request.width}"
        f" x {request.height} x {DECODED_BYTES_PER_PIXEL} = {decoded} bytes to decode exceeds this server's "
        f"max_video_decode_bytes ({limit}): ask for fewer frames or a smaller size"
    )
    return [_error("video_decode_too_large", loc, "num_frames", message, frames)]


def task_errors(request: GenerateRequest, worker: ModelCapabilities, loc: Loc) -> list[ErrorDict]:
    """The request's task, when the worker's runner of its model does not do it."""
    if request.task in worker.tasks:
        return []
    does = ", ".join(sorted(task.value for task in worker.tasks))
    message = f"this fleet's model, {worker.model} ({worker.pipeline}), does not do {request.task}; it does {does}"
    return [_error("task_unsupported", loc, "image", message, "<image>")]


def served_models(fleet: Sequence[WorkerCapabilities]) -> dict[str, list[ModelCapabilities]]:
    """Each model some live worker serves, with what each of those workers announces for it, in announcement order."""
    served: dict[str, list[ModelCapabilities]] = {}
    for worker in fleet:
        for model in worker.served:
            served.setdefault(model.model, []).append(model)
    return served


def video_models(fleet: Sequence[WorkerCapabilities]) -> frozenset[str]:
    """The models of ``fleet`` that make videos: their image task is image-to-video, which takes no strength."""
    return frozenset(model for model, served in served_models(fleet).items() if any(one.traits.video for one in served))


def capability_errors(
    requests: Sequence[GenerateRequest],
    fleet: Sequence[WorkerCapabilities],
    locs: Sequence[Loc],
    settings: Settings,
) -> list[ErrorDict]:
    """What the fleet cannot run, for every request (each error at its request's ``loc``): a model it does not have,
    or what no live worker of the request's model can do."""
    served = served_models(fleet)
    known = settings.catalog
    errors: list[ErrorDict] = []
    for request, loc in zip(requests, locs, strict=True):
        model = request_model(request, settings)
        if model not in known:
            message = f"unknown model {model!r}; this fleet serves {', '.join(known)} (GET /v1/models)"
            errors.append(_error("model_unknown", loc, "model", message, model))
            continue
        per_worker = [
            task_errors(request, worker, loc)
            + trait_errors(request, worker.traits, worker.model, loc)
            + decode_errors(request, worker.traits, settings.max_video_decode_bytes, loc)
            for worker in served.get(model, ())
        ]
        if per_worker and all(per_worker):
            errors += per_worker[0]
    return errors
