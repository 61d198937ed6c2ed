"""``POST /v1/images/generations`` (JSON) and ``POST /v1/images/edits`` (multipart/form-data), OpenAI-compatible.

Each call is one ordinary fleet request, awaited (``api.openai.generation``); every error is in OpenAI's shape
(``api.openai.errors``). Bodies and their translation to the native request: ``api.openai.schemas``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import JSONResponse

from api.auth import CallerDep
from api.deps import SettingsDep, StoreDep, WaiterDep
from api.openai.errors import OpenAIRoute
from api.openai.generation import OpenAICall, respond
from api.openai.schemas import ImageEditForm, ImageGenerationRequest

router = APIRouter(prefix="/v1/images", tags=["openai"], route_class=OpenAIRoute, include_in_schema=False)


async def call_of(
    request: Request, settings: SettingsDep, store: StoreDep, waiter: WaiterDep, caller: CallerDep
) -> OpenAICall:
    return OpenAICall(request, settings, store, waiter, caller)


CallDep = Annotated[OpenAICall, Depends(call_of)]


@router.post("/generations")
async def create_image(body: ImageGenerationRequest, call: CallDep) -> JSONResponse:
    """Generate ``n`` images for a prompt: ``{"created", "data": [...]}``, the request id in ``x-request-id``."""
    return await respond(body.native(call.settings), body.answer_format, call)


@router.post("/edits")
async def edit_image(form: Annotated[ImageEditForm, Form()], call: CallDep) -> JSONResponse:
    """Image-to-image (``image``) or inpainting (``image`` and ``mask``) for a prompt; the answer as for
    generations."""
    return await respond(await form.native(call.settings), form.answer_format, call)
