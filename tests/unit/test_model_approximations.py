"""Approximate accelerations per model: ``[models.<name>]`` of the fleet config file and ``model_approximations``
set a model's own step_cache and weight_quantization over the fleet's; a runner of the model reads them
(``Settings.for_model``); bad values are errors naming the file, the line and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from shared.settings import CONFIG_VARIABLE, ConfigFileError, Settings

FLEET = """\
step_cache = "taylorseer:4"

[models.sd]
source = "demo:stable-diffusion"
step_cache = "deepcache:3"
weight_quantization = "int8_weight"
max_num_seqs = 8

[models.flux]
source = "demo:flux"
"""


def _config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    monkeypatch.setenv(CONFIG_VARIABLE, str(path))
    return path


def test_a_model_table_sets_its_own_approximations(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _config(monkeypatch, tmp_path, FLEET)
    settings = Settings()
    sd, flux = settings.for_model("sd"), settings.for_model("flux")
    assert (sd.step_cache, sd.weight_quantization, sd.demo_family) == ("deepcache:3", "int8_weight", "stable-diffusion")
    assert (flux.step_cache, flux.weight_quantization) == ("taylorseer:4", "off")  # the fleet's
    assert settings.batching_for("sd").max_num_seqs == 8  # engine args beside them, as before


def test_the_environment_sets_them_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUSEFLEET_MODELS", '{"sd": "demo:stable-diffusion", "px": "demo:pixart"}')
    monkeypatch.setenv("FUSEFLEET_MODEL_APPROXIMATIONS", '{"px": {"weight_quantization": "fp8_weight"}}')
    settings = Settings()
    assert settings.for_model("px").weight_quantization == "fp8_weight"
    assert settings.for_model("sd").weight_quantization == "off"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('step_cache = "deepcache:1"', "line 3: models.sd.step_cache: .*the interval of deepcache"),
        ('weight_quantization = "int4"', "line 3: models.sd.weight_quantization: Input should be 'off'"),
        ('step_cach = "deepcache:3"', "line 3: models.sd.step_cach: not an engine arg of a model .*step_cache"),
    ],
)
def test_a_bad_value_names_the_file_line_and_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, entry: str, message: str
) -> None:
    path = _config(monkeypatch, tmp_path, f'[models.sd]\nsource = "demo:stable-diffusion"\n{entry}\n')
    with pytest.raises(ConfigFileError, match=message) as caught:
        Settings()
    assert str(path) in str(caught.value)


def test_they_name_models_of_the_fleet() -> None:
    with pytest.raises(ValidationError, match="model_approximations names px, not among models"):
        Settings(models={"sd": "demo:stable-diffusion"}, model_approximations={"px": {"step_cache": "deepcache:3"}})
    with pytest.raises(ValidationError, match="step_cache: 'foo:1' is not one of"):
        Settings(models={"sd": "demo:stable-diffusion"}, model_approximations={"sd": {"step_cache": "foo:1"}})
