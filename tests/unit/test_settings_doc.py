"""The settings reference stays complete: .env.example and docs/configuration.md list every setting."""

from __future__ import annotations

from pathlib import Path

from fusefleet.settings_doc import render_env_example, render_markdown_table
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_every_setting_is_documented_with_a_description() -> None:
    for field, info in Settings.model_fields.items():
        assert info.description, f"{field} has no description"


def test_env_example_is_current() -> None:
    assert (ROOT / ".env.example").read_text() == render_env_example(), "run: fusefleet settings > .env.example"


def test_configuration_doc_lists_every_setting_with_its_default() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert doc.endswith(render_markdown_table()), "run: fusefleet settings --markdown (the doc's last section)"
