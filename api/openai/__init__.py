"""The OpenAI Images API on the api process, beside the native one (as vLLM-Omni, SGLang and Dynamo serve diffusion).

``POST /v1/images/generations``, ``POST /v1/images/edits``, ``GET /v1/models`` and ``GET /v1/models/{id}``: each
image call is one ordinary, batchable fleet request (visible under ``/v1/requests/{id}``), answered in OpenAI's
shapes; ``/v1/videos`` (``api.openai.videos``) serves OpenAI's asynchronous video jobs, each a native request too.
These routes are left out of the served OpenAPI document (OpenAI's own specification describes them;
docs/api.md says what differs). ``install`` adds them to an app.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI, params

from api.openai import images, models, videos
from api.openai.errors import OpenAIBodyLimitShape


def install(app: FastAPI, dependencies: Sequence[params.Depends] = ()) -> None:
    """Add the OpenAI routes to ``app``, each with ``dependencies`` (``api.auth.AUTHENTICATED``: its 401 comes in
    OpenAI's shape too). Call it after the body-limit middleware is added: its 413 is then answered in OpenAI's
    shape on the OpenAI paths."""
    app.include_router(images.router, dependencies=dependencies)
    app.include_router(models.router, dependencies=dependencies)
    app.include_router(videos.router, dependencies=dependencies)
    app.add_middleware(OpenAIBodyLimitShape)
