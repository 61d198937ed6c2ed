"""The fleet config file: one TOML file every service reads (``FUSEFLEET_CONFIG=path``, or ``--config`` on the
command line), below the environment: ``FUSEFLEET_*`` variables still override what it says.

Its top level holds fleet-wide settings by their names (``max_num_seqs = 4``); ``[models.<name>]`` tables hold the
fleet's models, each its ``source`` and, where it differs, its own engine args (``shared.settings.batching.
MODEL_ENGINE_ARGS``) and approximate accelerations (``shared.settings.acceleration.MODEL_APPROXIMATIONS``);
``[models] name = "source"`` is the short form. The file becomes ``models`` (name -> source), ``model_batching``
(name -> engine args) and ``model_approximations`` (name -> step_cache, weight_quantization) plus the top-level
settings. A bad file fails at start with a
``ConfigFileError`` naming the file, the line and the key: TOML syntax, a key no setting has, a value of the wrong
type or out of its bounds (the value itself is never echoed: it may be a secret).
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from shared.settings.acceleration import MODEL_APPROXIMATIONS, AccelerationSettings
from shared.settings.batching import MODEL_ENGINE_ARGS, BatchingSettings, ModelBatching
from shared.settings.concern import ENV_PREFIX, field_adapter

CONFIG_VARIABLE = f"{ENV_PREFIX}CONFIG"
"""The environment variable naming the fleet config file (unset: none is read)."""
CONFIG_DESCRIPTION = (
    "Path of the fleet config file (TOML: fleet-wide settings by name, [models.<name>] tables with each model's "
    "source and engine args), read by every service below these variables, which override it; also --config. "
    "Unset: none is read (docs/configuration.md)."
)
"""What ``CONFIG_VARIABLE`` means, as .env.example and docs/configuration.md say it."""
MODELS_TABLE = "models"
SOURCE_KEY = "source"
_HEADER = re.compile(r"^\s*\[\s*([^\]]+?)\s*\]\s*(#.*)?$")
_ASSIGNMENT = re.compile(r"^\s*\"?([A-Za-z0-9_.-]+?)\"?\s*=")


MODEL_SHARE = "share"
"""A model's weight in the fair order (``ModelBatching.share``), beside its engine args in its table."""


class ConfigFileError(ValueError):
    """The fleet config file cannot be used: the message names the file, the line (where known) and the key."""


def _line_of(text: str, table: str, key: str) -> int | None:
    """The line (1-based) where ``key`` is set in ``[table]`` (``""``: the top level), or None."""
    current = ""
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header:
            current = header.group(1).replace('"', "").replace(" ", "")
            continue
        assignment = _ASSIGNMENT.match(line)
        if assignment and current == table and assignment.group(1) == key:
            return number
        if assignment and current == "" and table and assignment.group(1) == table.split(".")[0]:
            return number  # an inline table: models = { sd = "..." }
    return None


class FleetConfigFile(PydanticBaseSettingsSource):
    """A pydantic-settings source: the values of the fleet config file (``CONFIG_VARIABLE``), checked key by key."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None = None) -> None:
        super().__init__(settings_cls)
        if path is None:
            named = os.environ.get(CONFIG_VARIABLE, "").strip()
            path = Path(named).expanduser() if named else None
        self.path = path

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ reads the whole file at once

    def __call__(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            text = self.path.read_text()
        except OSError as exc:
            raise ConfigFileError(f"{CONFIG_VARIABLE}={self.path}: cannot read the fleet config file: {exc}") from None
        try:
            found = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigFileError(f"{self.path}: not TOML: {exc}") from None
        return _Reading(self.settings_cls, self.path, text).values(found)


class _Reading:
    """One reading of a config file's parsed contents into settings values, each key checked where it stands."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path, text: str) -> None:
        self.fields = settings_cls.model_fields
        self.path = path
        self.text = text

    def error(self, table: str, key: str, why: str) -> ConfigFileError:
        line = _line_of(self.text, table, key)
        where = f"{self.path}, line {line}" if line is not None else str(self.path)
        name = f"{table}.{key}" if table else key
        return ConfigFileError(f"{where}: {name}: {why}")

    def check(self, table: str, key: str, value: object, info: FieldInfo) -> None:
        try:
            field_adapter(info).validate_python(value)
        except ValidationError as exc:
            raise self.error(table, key, exc.errors()[0]["msg"]) from None

    def values(self, found: dict[str, Any]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for key, value in found.items():
            if key == MODELS_TABLE:
                continue
            info = self.fields.get(key)
            if info is None:
                close = difflib.get_close_matches(key, list(self.fields), n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise self.error("", key, f"no such setting{hint}")
            self.check("", key, value, info)
            values[key] = value
        models = found.get(MODELS_TABLE)
        if models is not None:
            values.update(self.models(models))
        return values

    def models(self, models: object) -> dict[str, Any]:
        if not isinstance(models, dict):
            raise self.error("", MODELS_TABLE, "must be a table of models ([models.<name>] with a source)")
        sources: dict[str, str] = {}
        batching: dict[str, dict[str, Any]] = {}
        approximations: dict[str, dict[str, Any]] = {}
        for name, entry in models.items():
            table = f"{MODELS_TABLE}.{name}"
            if isinstance(entry, str):
                sources[name] = entry
                continue
            if not isinstance(entry, dict) or not isinstance(entry.get(SOURCE_KEY), str):
                raise self.error(MODELS_TABLE, name, f"a model is a source string or a table with {SOURCE_KEY!r}")
            sources[name] = entry[SOURCE_KEY]
            own: dict[str, Any] = {}
            for key, value in entry.items():
                if key == SOURCE_KEY:
                    continue
                if key in MODEL_APPROXIMATIONS:
                    self.check(table, key, value, AccelerationSettings.model_fields[key])
                    approximations.setdefault(name, {})[key] = value
                    continue
                if key == MODEL_SHARE:  # its weight in the fair order, not an engine arg
                    self.check(table, key, value, ModelBatching.model_fields[key])
                    own[key] = value
                    continue
                if key not in MODEL_ENGINE_ARGS:
                    allowed = ", ".join((*MODEL_ENGINE_ARGS, MODEL_SHARE, *MODEL_APPROXIMATIONS))
                    raise self.error(table, key, f"not an engine arg of a model (one of {allowed})")
                self.check(table, key, value, BatchingSettings.model_fields[key])
                own[key] = value
            if own:
                batching[name] = own
        values: dict[str, Any] = {"models": sources}
        if batching:
            values["model_batching"] = batching
        if approximations:
            values["model_approximations"] = approximations
        return values
