"""The fleet's models as data (``shared.settings.model``) and their queues (``shared.routing``): the environment's
forms, the defaults of a fleet of one model, and each refusal naming its setting."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.routing import model_queue, served_queues, worker_queue
from shared.settings import Settings


def test_unset_is_the_one_model_of_before() -> None:
    demo = Settings()
    assert demo.catalog == {"demo": "demo:stable-diffusion"}
    assert demo.model_id == "demo" and demo.served_models == ("demo",)
    assert model_queue(demo, "demo") == demo.queue_name == "fusefleet.batches"
    pipeline = Settings(model="/models/sd15", demo_family="pixart")
    assert pipeline.catalog == {"/models/sd15": "/models/sd15"} and pipeline.model_id == "/models/sd15"
    assert Settings(model="").model_id == "demo"  # compose passes FUSEFLEET_MODEL through, empty


def test_models_from_the_environment_pairs_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUSEFLEET_MODELS", " sd = demo:stable-diffusion, px=demo:pixart ,")
    monkeypatch.setenv("FUSEFLEET_WORKER_MODELS", "px")
    settings = Settings()
    assert settings.catalog == {"sd": "demo:stable-diffusion", "px": "demo:pixart"}
    assert settings.model_id == "sd" and settings.served_models == ("px",)
    monkeypatch.setenv("FUSEFLEET_MODELS", '{"real": "org/pipe", "sd": "demo:stable-diffusion"}')
    monkeypatch.setenv("FUSEFLEET_WORKER_MODELS", '["sd"]')
    monkeypatch.setenv("FUSEFLEET_DEFAULT_MODEL", "sd")
    settings = Settings()
    assert settings.model_id == "sd" and settings.served_models == ("sd",)


def test_each_model_reads_its_source() -> None:
    settings = Settings(models="sd=demo:stable-diffusion,px=demo:pixart,real=/models/x")
    assert (settings.for_model("px").model, settings.for_model("px").demo_family) == (None, "pixart")
    assert settings.for_model("real").model == "/models/x"
    with pytest.raises(KeyError):
        settings.for_model("other")


def test_the_default_model_keeps_the_fleet_queue_the_others_their_own() -> None:
    settings = Settings(key_prefix="p", models="sd=demo:stable-diffusion,px=demo:pixart", default_model="px")
    assert model_queue(settings, "px") == "p.batches"
    assert model_queue(settings, "sd") == "p.batches.sd"
    assert served_queues(settings, "w1") == ("p.batches.sd", "p.batches", "p.batches@w1")  # its own queue last


def test_a_worker_of_a_fleet_of_one_model_consumes_the_fleet_queue_only() -> None:
    settings = Settings(key_prefix="p")
    assert served_queues(settings, "w1") == ("p.batches",)
    assert worker_queue(settings, "w1") == "p.batches@w1"


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"models": "a b=demo:pixart"}, "models: 'a b' is not a model name"),
        ({"models": "a/b=demo:pixart"}, "models: 'a/b' is not a model name"),
        ({"models": "a=demo:"}, "models: 'a' has no source"),
        ({"models": "a"}, "models: 'a' is not name=source"),
        ({"models": "a=x,a=y"}, "models: 'a' is named twice"),
        ({"models": "a=x", "default_model": "b"}, "default_model 'b' is not one of models (a)"),
        ({"models": "a=x", "worker_models": "a,c"}, "worker_models names c, not among models (a)"),
        ({"worker_models": "sd"}, "worker_models names sd, not among models (demo)"),
        ({"models": "a=x", "model": "/m"}, "model is set beside models"),
    ],
)
def test_refusals_name_the_setting(fields: dict[str, str], named: str) -> None:
    with pytest.raises(ValidationError, match="models|model") as caught:
        Settings(**fields)  # type: ignore[arg-type]
    assert named in str(caught.value)
