"""The fleet config file (shared.settings.config_file): TOML below the environment, models with their own engine
args, and errors that name the file, the line and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from shared.settings import CONFIG_VARIABLE, ConfigFileError, Settings

FLEET = """\
key_prefix = "studio"
max_num_seqs = 4
request_batch_max_wait_ms = 20.0
default_model = "px"

[models.sd]
source = "demo:stable-diffusion"
max_num_seqs = 8

[models.px]
source = "demo:pixart"
request_batch_max_wait_ms = 50
max_batch_pixels = 1048576
"""


def _config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    monkeypatch.setenv(CONFIG_VARIABLE, str(path))
    return path


def _error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str) -> str:
    path = _config(monkeypatch, tmp_path, text)
    with pytest.raises(ConfigFileError) as caught:
        Settings()
    assert str(path) in str(caught.value)
    return str(caught.value)


def test_the_file_sets_the_fleet_and_each_models_own_engine_args(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _config(monkeypatch, tmp_path, FLEET)
    settings = Settings()
    assert (settings.key_prefix, settings.queue_name, settings.max_num_seqs) == ("studio", "studio.batches", 4)
    assert settings.models == {"sd": "demo:stable-diffusion", "px": "demo:pixart"}
    assert settings.model_id == "px"
    sd, px = settings.batching_for("sd"), settings.batching_for("px")
    assert (sd.max_num_seqs, sd.request_batch_max_wait_ms, sd.max_batch_pixels) == (8, 20.0, 16_777_216)
    assert (px.max_num_seqs, px.request_batch_max_wait_ms, px.max_batch_pixels) == (4, 50.0, 1_048_576)
    assert px.wait_stable_ms == 10.0  # the quiet window follows the model's own wait


def test_environment_overrides_the_file_and_arguments_override_both(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _config(monkeypatch, tmp_path, FLEET)
    monkeypatch.setenv("FUSEFLEET_MAX_NUM_SEQS", "2")
    monkeypatch.setenv("FUSEFLEET_MODEL_BATCHING", '{"sd": {"max_num_seqs": 3}}')
    settings = Settings()
    assert settings.max_num_seqs == 2 and settings.key_prefix == "studio"
    assert settings.batching_for("sd").max_num_seqs == 3  # the variable replaces every model's own args of the file
    assert settings.batching_for("px").request_batch_max_wait_ms == 20.0  # so px batches by the fleet-wide ones
    assert Settings(max_num_seqs=6).max_num_seqs == 6


def test_no_file_no_change_and_empty_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONFIG_VARIABLE, raising=False)
    assert Settings().model_batching == {} and Settings().key_prefix == "fusefleet"
    monkeypatch.setenv(CONFIG_VARIABLE, "")  # as .env.example and compose write an unset one
    monkeypatch.setenv("FUSEFLEET_MODEL_BATCHING", "")
    assert Settings().model_batching == {}


def test_the_short_form_names_sources_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _config(monkeypatch, tmp_path, '[models]\nsd = "demo:stable-diffusion"\npx = "demo:pixart"\n')
    settings = Settings()
    assert settings.models == {"sd": "demo:stable-diffusion", "px": "demo:pixart"}
    assert settings.model_batching == {} and settings.batching_for("px") == settings


def test_an_unknown_setting_is_named_with_its_line_and_a_guess(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    message = _error(monkeypatch, tmp_path, 'key_prefix = "a"\nmax_num_seq = 4\n')
    assert "line 2: max_num_seq: no such setting (did you mean max_num_seqs?)" in message


def test_a_value_out_of_bounds_is_named_with_its_table_and_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    text = '[models.sd]\nsource = "demo:stable-diffusion"\n\n[models.px]\nsource = "demo:pixart"\nmax_num_seqs = 0\n'
    message = _error(monkeypatch, tmp_path, text)
    assert "line 6: models.px.max_num_seqs: Input should be greater than or equal to 1" in message
    message = _error(monkeypatch, tmp_path, 'redis_socket_timeout_s = "soon"\n')
    assert "line 1: redis_socket_timeout_s: Input should be a valid number" in message


def test_a_model_table_takes_engine_args_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    message = _error(monkeypatch, tmp_path, '[models.sd]\nsource = "demo:stable-diffusion"\nkey_prefix = "x"\n')
    assert "line 3: models.sd.key_prefix: not an engine arg of a model" in message
    message = _error(monkeypatch, tmp_path, "[models.sd]\nmax_num_seqs = 2\n")
    assert "models.sd: a model is a source string or a table with 'source'" in message


def test_bad_toml_and_a_missing_file_name_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert "not TOML" in _error(monkeypatch, tmp_path, "max_num_seqs = = 4\n")
    monkeypatch.setenv(CONFIG_VARIABLE, str(tmp_path / "absent.toml"))
    with pytest.raises(ConfigFileError, match="absent.toml: cannot read the fleet config file"):
        Settings()


def test_model_batching_names_models_of_the_fleet() -> None:
    with pytest.raises(ValidationError, match="model_batching names px, not among models"):
        Settings(models={"sd": "demo:stable-diffusion"}, model_batching={"px": {"max_num_seqs": 2}})
    with pytest.raises(ValidationError, match="max_num_seqs: Input should be less than or equal to 256"):
        Settings(models={"sd": "demo:stable-diffusion"}, model_batching={"sd": {"max_num_seqs": 300}})


def test_a_model_table_sets_its_share_in_the_fair_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _config(monkeypatch, tmp_path, FLEET.replace("max_num_seqs = 8\n", "max_num_seqs = 8\nshare = 3.0\n"))
    settings = Settings()
    assert settings.model_batching["sd"].share == 3.0 and settings.model_batching["px"].share == 1.0
    assert settings.batching_for("sd").max_num_seqs == 8
    assert "share" in _error(monkeypatch, tmp_path, FLEET.replace("max_num_seqs = 8\n", "share = 0\n"))
