"""What every concern of the settings shares: ``SettingsConcern``, the base of each concern's class (one
``FUSEFLEET_*`` environment, frozen, a field's docstring its description), and the field types several concerns use.

A concern's class holds its fields and validates its own rules; ``shared.settings.Settings`` composes them
(``docs/configuration.md``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BeforeValidator, TypeAdapter
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "FUSEFLEET_"
"""Every setting ``name`` is read from the environment variable ``FUSEFLEET_<NAME>``."""


def default_cache_dir() -> Path:
    """Where fusefleet keeps what it builds once per host (the demo model; the folder result store's default)."""
    return Path.home() / ".cache" / "fusefleet"


def _empty_is_unset(value: object) -> object:
    return None if value == "" else value


def _json_object(value: object) -> object:
    if isinstance(value, str):
        return json.loads(value) if value.strip() else {}
    return value


def _expand_user(value: Path | None) -> Path | None:
    return value.expanduser() if value is not None else None


UserPath = Annotated[Path, AfterValidator(_expand_user)]
"""A path, ``~`` expanded."""
OptionalUserPath = Annotated[Path | None, AfterValidator(_expand_user)]
"""A path or unset, ``~`` expanded."""
EmptyIsUnset = BeforeValidator(_empty_is_unset)
"""Marks an optional field whose empty value (``FUSEFLEET_X=``, as .env.example writes it) means unset."""
JsonObjectFromEnv = BeforeValidator(_json_object)
"""Marks a per-model table (with ``NoDecode``): the environment gives it as a JSON object; empty is none (the config
file gives it as its tables)."""


class SettingsConcern(BaseSettings):
    """The settings of one concern, read from ``FUSEFLEET_*`` variables; its validators check its own rules."""

    # hide_input_in_errors: an invalid setting is named with its rule, never echoed with the other inputs (a Redis URL
    # with its password would be, in part, in every service's start-up error)
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="ignore", hide_input_in_errors=True, use_attribute_docstrings=True
    )

    section: ClassVar[str] = ""
    """The concern's heading in the settings reference (``fusefleet settings``)."""


def field_adapter(info: FieldInfo) -> TypeAdapter[Any]:
    """Validates a value as the setting of ``info`` does: its type and bounds (not its class's validators)."""
    annotation: Any = info.annotation
    return TypeAdapter(Annotated[annotation, *info.metadata] if info.metadata else annotation)
