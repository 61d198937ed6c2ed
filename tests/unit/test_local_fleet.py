"""``fusefleet.local``'s keyword settings, checked before anything starts and handed to every service as their
variables."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import fusefleet
from fusefleet.local_fleet import local, settings_env


def test_keyword_settings_become_the_services_variables() -> None:
    assert fusefleet.local is local
    env = settings_env(
        {"max_num_seqs": 4, "step_mode": True, "models": {"sd": "demo:stable-diffusion"}, "worker_models": ["sd"]}
    )
    assert env == {
        "FUSEFLEET_MAX_NUM_SEQS": "4",
        "FUSEFLEET_STEP_MODE": "true",
        "FUSEFLEET_MODELS": '{"sd": "demo:stable-diffusion"}',
        "FUSEFLEET_WORKER_MODELS": '["sd"]',
    }


def test_a_bad_setting_is_refused_before_anything_starts() -> None:
    with pytest.raises(TypeError, match="no such setting: max_num_seq"):
        settings_env({"max_num_seq": 4})
    with pytest.raises(ValidationError, match="max_num_seqs"):
        settings_env({"max_num_seqs": 0})
