"""The OpenAPI document states this server's own limits, so a client (or a schema-based tester) can tell whether
a request is acceptable without sending it.

The pydantic models carry the fixed bounds only; ``Settings`` adds per-fleet ones (``api.limits``). Here they are
written into the served schema of ``GenerateRequest``: ``maxLength`` of the prompts, ``maximum`` of the
sides, steps, ``n`` and ``num_frames``, and the LoRA adapter names present in the LoRA folder (read each time the
document is served); without ``webhook_allowed_hosts``, that the webhook fields must be null.
The per-batch pixel budget (a product of fields) cannot be stated in JSON Schema; its description names it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from shared.contracts import MAX_SEED, LoraRef
from shared.settings import Settings

Schema = dict[str, Any]


def serve_limits(app: FastAPI, settings: Settings) -> None:
    """Make ``app`` serve its OpenAPI document with the limits of ``settings`` written in."""
    build: Callable[[], Schema] = app.openapi

    def openapi() -> Schema:
        document = copy.deepcopy(build())  # FastAPI caches the plain document; the adapters may change
        state_limits(document, settings)
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def lora_adapters(settings: Settings) -> list[str]:
    """Names of the adapters a request may use: the LoRA folder's sub-folders with a valid ``LoraRef`` name."""
    if settings.lora_dir is None:
        return []
    pattern = re.compile(_name_schema().get("pattern", ".*"))
    max_length = int(_name_schema().get("maxLength", 128))
    try:
        entries = list(settings.lora_dir.iterdir())
    except OSError:
        return []
    return sorted(
        entry.name
        for entry in entries
        if len(entry.name) <= max_length and pattern.fullmatch(entry.name) and entry.is_dir()
    )


def _name_schema() -> Schema:
    name: Schema = LoraRef.model_json_schema()["properties"]["name"]
    return name


def state_limits(document: Schema, settings: Settings) -> None:
    """Write the limits of ``settings`` into ``document`` (in place); parts it does not find are left alone."""
    schemas: Schema = document.get("components", {}).get("schemas", {})
    request = schemas.get("GenerateRequest")
    if request is None:
        return
    props: Schema = request.get("properties", {})
    _set(props, "prompt", maxLength=settings.max_prompt_chars)
    _set(props, "negative_prompt", maxLength=settings.max_prompt_chars)
    _set(props, "width", maximum=settings.max_image_side)
    _set(props, "height", maximum=settings.max_image_side)
    _set(props, "num_inference_steps", maximum=settings.max_inference_steps)
    _set(props, "n", maximum=settings.max_images_per_request)
    _set(props, "num_frames", maximum=settings.max_num_frames)
    _set(props, "seed", maximum=MAX_SEED)  # exact: the generated float 9.223372036854776e18 is 2**63
    _set(props, "timeout_s", maximum=settings.max_timeout_s)
    request["description"] = (
        f"{request.get('description', '')} This server also refuses (422) a request whose n x width x height "
        f"(x num_frames) exceeds its max_batch_pixels ({settings.max_batch_pixels})."
    ).strip()
    _set_names(props, "model", list(settings.catalog))
    if "lora" in props and "LoraRef" in schemas:
        props["lora"] = _lora(schemas["LoraRef"], lora_adapters(settings), props["lora"].get("description"))
    if not settings.webhook_allowed_hosts:
        _webhooks_off(props)


def _set(props: Schema, field: str, **bounds: float) -> None:
    """Add ``bounds`` to the property, or to its non-null branches when it is nullable (``anyOf``)."""
    prop = props.get(field)
    if prop is None:
        return
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") in ("string", "integer", "number"):
            branch.update(bounds)


def _set_names(props: Schema, field: str, names: list[str]) -> None:
    """The property's string branch may only be one of ``names`` (the rest of the fleet's names are refused, 422)."""
    prop = props.get(field)
    if prop is None:
        return
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") == "string":
            branch["enum"] = names


def _webhooks_off(props: Schema) -> None:
    """Without ``webhook_allowed_hosts`` every webhook is refused: the webhook fields may only be null."""
    for field in ("webhook", "webhook_events"):
        if field in props:
            note = props[field].get("description", "")
            props[field] = {
                "type": "null",
                "description": f"{note} This server has webhooks off: leave it out or null.",
            }


def _lora(lora_ref: Schema, adapters: list[str], description: str | None) -> Schema:
    note = description or "A LoRA adapter of the fleet's LoRA folder, by name."
    if not adapters:
        return {"type": "null", "description": f"{note} This server has none: leave it out or null."}
    ref = copy.deepcopy(lora_ref)
    ref["properties"]["name"]["enum"] = adapters
    return {"anyOf": [ref, {"type": "null"}], "description": note}
