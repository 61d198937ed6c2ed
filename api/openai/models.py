"""``GET /v1/models`` and ``GET /v1/models/{id}``: the one model this fleet serves, in OpenAI's list shape."""

from __future__ import annotations

import time

from fastapi import APIRouter

from api.deps import SettingsDep
from api.openai.errors import OpenAIRoute, model_not_found
from api.openai.schemas import ModelList, ModelObject

router = APIRouter(prefix="/v1/models", tags=["openai"], route_class=OpenAIRoute, include_in_schema=False)

STARTED = int(time.time())
"""``created`` of the model: when this api process started serving it."""


def _served(settings: SettingsDep) -> ModelObject:
    return ModelObject(id=settings.model_id, created=STARTED)


@router.get("")
async def list_models(settings: SettingsDep) -> ModelList:
    """``{"object": "list", "data": [{"id", "object": "model", "created", "owned_by": "fusefleet"}]}``."""
    return ModelList(data=[_served(settings)])


@router.get("/{model:path}")
async def retrieve_model(model: str, settings: SettingsDep) -> ModelObject:
    """The served model; 404 ``model_not_found`` for any other id (ids may hold slashes: hub ids, paths)."""
    served = _served(settings)
    if model != served.id:
        raise model_not_found(model)
    return served
