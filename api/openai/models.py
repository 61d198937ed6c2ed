"""``GET /v1/models`` and ``GET /v1/models/{id}``: the fleet's models, in OpenAI's list shape (the native api and the
OpenAI surface share these routes).

The list holds every model some live worker serves (``P:capabilities``), in the fleet's order (``Settings.catalog``,
then any other a worker announces), each with its family, tasks, live workers and whether any of them holds it
loaded now (``ModelObject``; ``gpu_worker.residency``). Retrieving one
answers any model of the fleet, served or not (then ``workers`` 0 and ``resident`` false), and 404
``model_not_found`` for any other id (ids may hold slashes: hub ids, paths).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from fastapi import APIRouter

from api.capabilities import served_models
from api.deps import SettingsDep, StoreDep
from api.openai.errors import OpenAIRoute, model_not_found
from api.openai.schemas import ModelList, ModelObject
from shared.contracts import ModelCapabilities
from shared.settings import Settings

router = APIRouter(prefix="/v1/models", tags=["openai"], route_class=OpenAIRoute, include_in_schema=False)

STARTED = int(time.time())
"""``created`` of every model: when this api process started serving it."""


def _model(name: str, workers: Sequence[ModelCapabilities]) -> ModelObject:
    first = workers[0] if workers else None
    return ModelObject(
        id=name,
        created=STARTED,
        family=first.traits.family if first is not None else None,
        tasks=sorted({task for worker in workers for task in worker.tasks}),
        workers=len(workers),
        resident=any(worker.resident for worker in workers),
    )


async def _fleet(settings: Settings, store: StoreDep) -> dict[str, list[ModelCapabilities]]:
    """Each model some live worker serves, the fleet's own first, in its order."""
    served = served_models(await store.fleet_capabilities())
    ordered = [name for name in settings.catalog if name in served]
    return {name: served[name] for name in [*ordered, *(name for name in served if name not in ordered)]}


@router.get("")
async def list_models(settings: SettingsDep, store: StoreDep) -> ModelList:
    """``{"object": "list", "data": [{"id", "object": "model", "created", "owned_by": "fusefleet", "family",
    "tasks", "workers", "resident"}]}``: every model some live worker serves."""
    return ModelList(data=[_model(name, workers) for name, workers in (await _fleet(settings, store)).items()])


@router.get("/{model:path}")
async def retrieve_model(model: str, settings: SettingsDep, store: StoreDep) -> ModelObject:
    """One model of the fleet (or one a live worker serves); 404 ``model_not_found`` for any other id."""
    fleet = await _fleet(settings, store)
    if model not in settings.catalog and model not in fleet:
        raise model_not_found(model, settings.catalog)
    return _model(model, fleet.get(model, []))
