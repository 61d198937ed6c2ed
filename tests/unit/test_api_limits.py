"""The api's limits of one request (``api.limits``): the per-batch pixel budget is its model's own where the fleet
config file gives that model one (``[models.<name>] max_batch_pixels``), else the fleet's."""

from __future__ import annotations

from api.limits import limit_errors, request_model
from shared.settings import Settings
from shared.wire import GenerateRequest

MODELS = {"sd": "demo:stable-diffusion", "big": "demo:pixart"}


def _settings() -> Settings:
    # 512 x 512 = 262144 pixels: over the small budget of "sd", under the fleet's (and so under "big"'s)
    return Settings(models=MODELS, max_batch_pixels=1_000_000, model_batching={"sd": {"max_batch_pixels": 200_000}})


def test_a_request_over_its_models_own_budget_is_refused_naming_that_budget() -> None:
    settings = _settings()
    [error] = limit_errors(GenerateRequest(prompt="x", model="sd", width=512, height=512), settings)
    assert error["type"] == "batch_pixels_exceeded" and error["loc"] == ("body", "width")
    assert error["ctx"] == {"pixels": 262_144, "max_batch_pixels": 200_000}


def test_the_same_request_for_a_model_without_its_own_budget_takes_the_fleets() -> None:
    settings = _settings()
    assert limit_errors(GenerateRequest(prompt="x", model="big", width=512, height=512), settings) == []
    [error] = limit_errors(GenerateRequest(prompt="x", model="big", n=4, width=512, height=512), settings)
    assert error["loc"] == ("body", "n") and error["ctx"]["max_batch_pixels"] == 1_000_000


def test_a_request_naming_no_model_is_for_the_default_one() -> None:
    settings = _settings()
    unnamed = GenerateRequest(prompt="x", width=512, height=512)
    assert request_model(unnamed, settings) == settings.model_id
    named_default = unnamed.model_copy(update={"model": settings.model_id})
    assert limit_errors(unnamed, settings) == limit_errors(named_default, settings)
