"""The settings: one class per concern, each validating its own rules, composed flat under ``Settings`` (every
field read from ``FUSEFLEET_<FIELD>``), which adds the rules between concerns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from shared.settings import (
    ENV_PREFIX,
    ApiSettings,
    ResultSettings,
    Settings,
    SettingsConcern,
    WebhookSettings,
    WiringSettings,
    WorkerSettings,
)


def test_the_concerns_hold_every_setting_once() -> None:
    concerns = Settings.concerns()
    assert len(concerns) == len(Settings.__bases__) > 5
    owned = [field for concern in concerns for field in concern.model_fields]
    assert len(owned) == len(set(owned))  # no field in two concerns
    assert set(owned) == set(Settings.model_fields)
    assert all(concern.section for concern in concerns)


def test_every_field_is_read_from_its_flat_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "MAX_NUM_SEQS": "4",
        "SCHEDULER_READ_COUNT": "7",
        "MAX_PROMPT_CHARS": "12",
        "RESULT_STORE": "filesystem",
        "WORKER_TTL_S": "9",
        "API_PORT": "8123",
        "WEBHOOK_CONCURRENCY": "3",
        "KEY_PREFIX": "other",
    }.items():
        monkeypatch.setenv(ENV_PREFIX + name, value)
    settings = Settings()
    assert (settings.max_num_seqs, settings.scheduler_read_count, settings.max_prompt_chars) == (4, 7, 12)
    assert (settings.result_store, settings.worker_ttl_s, settings.api_port) == ("filesystem", 9.0, 8123)
    assert settings.webhook_concurrency == 3
    assert settings.queue_name == "other.batches"  # unset: after the key prefix
    assert WorkerSettings().worker_ttl_s == 9.0  # a concern alone reads the same variables


def test_empty_means_unset_and_paths_expand_the_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUSEFLEET_API_KEYS_FILE", "")
    monkeypatch.setenv("FUSEFLEET_WEBHOOK_SECRET", "")
    monkeypatch.setenv("FUSEFLEET_QUEUE_NAME", "")
    settings = Settings()
    assert settings.api_keys_file is None and settings.webhook_secret is None
    assert settings.queue_name == "fusefleet.batches"
    home = Path.home()
    expanded = Settings(model_cache_dir="~/m", lora_dir="~/l", result_dir="~/r", api_keys_file="~/k.toml")
    assert (expanded.model_cache_dir, expanded.lora_dir) == (home / "m", home / "l")
    assert (expanded.result_dir, expanded.api_keys_file) == (home / "r", home / "k.toml")
    assert ApiSettings(api_keys_file="~/k.toml").api_keys_file == home / "k.toml"


@pytest.mark.parametrize(
    ("concern", "values", "rule"),
    [
        (WorkerSettings, {"worker_heartbeat_s": 6.0}, "at most half of batch_lock_ttl_s"),
        (WorkerSettings, {"visibility_timeout_s": 900}, "visibility_timeout_s .* must exceed batch_time_limit_s"),
        (ResultSettings, {"result_store": "s3"}, "needs s3_bucket"),
        (ResultSettings, {"result_store": "s3", "s3_bucket": "b", "result_store_timeout_s": 30}, "at least 66 s"),
        (WebhookSettings, {"webhook_allowed_hosts": ["hooks.example.com"]}, "needs webhook_secret"),
    ],
)
def test_each_concern_checks_its_own_rules(concern: type[SettingsConcern], values: dict[str, Any], rule: str) -> None:
    with pytest.raises(ValidationError, match=rule):
        concern(**values)
    with pytest.raises(ValidationError, match=rule):
        Settings(**values)


@pytest.mark.parametrize(
    ("concern", "values", "rule"),
    [
        (WiringSettings, {"redis_socket_timeout_s": 0.5}, "redis_socket_timeout_s .* must exceed scheduler_block_ms"),
        (ResultSettings, {"result_orphan_grace_s": 900.0}, "batch_time_limit_s \\+ redis_outage_retry_s \\(960"),
    ],
)
def test_the_root_checks_the_rules_between_concerns(
    concern: type[SettingsConcern], values: dict[str, Any], rule: str
) -> None:
    with pytest.raises(ValidationError, match=rule):
        Settings(**values)
    concern(**values)  # alone, the concern does not know the other side of the rule


def test_settings_are_frozen() -> None:
    with pytest.raises(ValidationError):
        Settings().max_num_seqs = 2  # type: ignore[misc]
