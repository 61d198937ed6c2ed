"""Every setting as a flag of ``fusefleet up``, ``scheduler`` and ``worker`` (fusefleet.settings_flags): a flag is
its variable for the process and what it starts, over the config file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from fusefleet import cli as fusefleet_cli
from fusefleet.settings_flags import flag_name, settings_fields, settings_flags
from shared.settings import CONFIG_VARIABLE, Settings

runner = CliRunner()


def _probe() -> tuple[typer.Typer, list[dict[str, str]]]:
    seen: list[dict[str, str]] = []
    app = typer.Typer()

    @app.command()
    @settings_flags(exclude=("api_port",))
    def probe(settings_env: dict[str, str], own: int = 1) -> None:
        seen.append({**settings_env, "own": str(own)})

    return app, seen


def test_every_setting_is_a_flag_named_after_it() -> None:
    assert set(settings_fields()) == set(Settings.model_fields)
    assert flag_name("request_batch_max_wait_ms") == "--request-batch-max-wait-ms"
    app, _ = _probe()
    shown = runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    for flag in ("--max-num-seqs", "--request-batch-max-wait-ms", "--models", "--key-prefix", "--config"):
        assert flag in shown
    assert "--api-port" not in shown and "Batching and queue order" in shown  # grouped by concern


def test_flags_become_their_variables_typed_as_the_setting() -> None:
    app, seen = _probe()
    result = runner.invoke(
        app,
        ["--max-num-seqs", "4", "--request-batch-max-wait-ms", "20", "--step-mode", "--models", "a=demo:sana",
         "--config", "fleet.toml", "--own", "3"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert seen == [
        {
            "FUSEFLEET_MAX_NUM_SEQS": "4",
            "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "20.0",
            "FUSEFLEET_STEP_MODE": "true",
            "FUSEFLEET_MODELS": "a=demo:sana",
            CONFIG_VARIABLE: "fleet.toml",
            "own": "3",
        }
    ]
    refused = runner.invoke(app, ["--max-num-seqs", "four"])
    assert refused.exit_code == 2 and "--max-num-seqs" in refused.output


def test_the_scheduler_reads_its_flags_over_its_config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text('key_prefix = "filed"\nmax_num_seqs = 2\n')
    for name in ("FUSEFLEET_MAX_NUM_SEQS", CONFIG_VARIABLE):  # the command sets them in this process:
        monkeypatch.setenv(name, "x")  # recorded as they were, so restored after the test
        monkeypatch.delenv(name)
    ran: list[Settings] = []
    monkeypatch.setattr("scheduler.app.run_scheduler", ran.append)
    result = runner.invoke(fusefleet_cli.cli, ["scheduler", "--config", str(config), "--max-num-seqs", "6"])
    assert result.exit_code == 0, result.output
    (settings,) = ran
    assert (settings.key_prefix, settings.max_num_seqs) == ("filed", 6)


def test_the_api_reads_its_flags_and_binds_to_its_host_and_port(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FUSEFLEET_MAX_PROMPT_CHARS", "FUSEFLEET_KEY_PREFIX"):  # set by the command in this process
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    served: list[tuple[Settings, str, int]] = []
    monkeypatch.setattr("api.app.create_app", lambda settings: settings)
    monkeypatch.setattr("uvicorn.run", lambda app, host, port, **_: served.append((app, host, port)))
    args = ["api", "--key-prefix", "flagged", "--max-prompt-chars", "77", "--host", "0.0.0.0", "--port", "8123"]
    result = runner.invoke(fusefleet_cli.cli, args)
    assert result.exit_code == 0, result.output
    ((settings, host, port),) = served
    assert (settings.key_prefix, settings.max_prompt_chars, host, port) == ("flagged", 77, "0.0.0.0", 8123)
    shown = runner.invoke(fusefleet_cli.cli, ["api", "--help"], env={"COLUMNS": "200"}).output
    assert "--max-num-seqs" in shown and "--api-port" not in shown  # --host and --port stand for those two


def test_up_hands_its_flags_to_every_service(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr("fusefleet.up.run_up", lambda *args: calls.append(args) or 0)
    result = runner.invoke(
        fusefleet_cli.cli, ["up", "--workers", "2", "--models", "sd=demo:stable-diffusion,pixart=demo:pixart"]
    )
    assert result.exit_code == 0, result.output
    ((host, port, workers, _, env),) = calls
    assert (host, port, workers) == ("127.0.0.1", 8000, 2)
    assert env == {"FUSEFLEET_MODELS": "sd=demo:stable-diffusion,pixart=demo:pixart"}
    shown = runner.invoke(fusefleet_cli.cli, ["up", "--help"], env={"COLUMNS": "200"}).output
    assert "--api-port" not in shown and "--worker-name" not in shown  # up sets these itself
