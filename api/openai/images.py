"""``POST /v1/images/generations`` (JSON) and ``POST /v1/images/edits`` (multipart/form-data), OpenAI-compatible.

Each call is one ordinary fleet request, awaited (``api.openai.generation``); every error is in OpenAI's shape
(``api.openai.errors``). Bodies and their translation to the native request: ``api.openai.schemas``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import JSONResponse

from api.auth import CallerDep
from api.deps import SettingsDep, StoreDep, WaiterDep
from api.openai.errors import OpenAIRoute
from api.openai.generation import respond
from api.openai.schemas import ImageEditForm, ImageGenerationRequest

router = APIRouter(prefix="/v1/images", tags=["openai"], route_class=OpenAIRoute, include_in_schema=False)


@router.post("/generations")
async def create_image(
    body: ImageGenerationRequest,
    request: Request,
    settings: SettingsDep,
    store: StoreDep,
    waiter: WaiterDep,
    caller: CallerDep,
) -> JSONResponse:
    """Generate ``n`` images for a prompt: ``{"created", "data": [...]}``, the request id in ``x-request-id``."""
    native = body.native(settings)
    return await respond(
        native, body.answer_format, request=request, settings=settings, store=store, waiter=waiter, caller=caller
    )


@router.post("/edits")
async def edit_image(
    form: Annotated[ImageEditForm, Form()],
    request: Request,
    settings: SettingsDep,
    store: StoreDep,
    waiter: WaiterDep,
    caller: CallerDep,
) -> JSONResponse:
    """Image-to-image (``image``) or inpainting (``image`` and ``mask``) for a prompt; the answer as for
    generations."""
    native = await form.native(settings)
    return await respond(
        native, form.answer_format, request=request, settings=settings, store=store, waiter=waiter, caller=caller
    )
