"""Every setting as a command-line flag: ``--max-num-seqs 4`` is ``FUSEFLEET_MAX_NUM_SEQS=4`` for that process and
those it starts, as vLLM-Omni takes its engine args as serve flags; ``--config PATH`` names the fleet config file.

``settings_flags`` derives the flags once from ``shared.settings.Settings``' fields (name, type, description,
grouped by concern in ``--help``) and adds them to a typer command; the command receives them as the environment
variables they stand for (``settings_env``), so a flag, its variable and its config-file key are one setting, read
by one parser, with one precedence: flag, then variable, then the config file, then the default.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from shared.settings import CONFIG_VARIABLE, ENV_PREFIX, Settings

SETTINGS_ENV = "settings_env"
"""The parameter of a command that receives its flags, as ``FUSEFLEET_*`` variable -> value."""
CONFIG_FLAG = "config"
SIMPLE_TYPES: tuple[type, ...] = (int, float, bool)
"""Settings of these types keep their type as flags (typer checks them; a bool is --x/--no-x); others are text,
parsed as their variable is."""

Command = TypeVar("Command", bound=Callable[..., Any])


def flag_name(field: str) -> str:
    """``max_num_seqs`` -> ``--max-num-seqs``."""
    return "--" + field.replace("_", "-")


def env_value(value: object) -> str:
    """A flag's value as its variable holds it."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _parameter(field: str, section: str) -> inspect.Parameter:
    info = Settings.model_fields[field]
    kind: Any = info.annotation if info.annotation in SIMPLE_TYPES else str
    names = [f"{flag_name(field)}/--no-{field.replace('_', '-')}"] if kind is bool else [flag_name(field)]
    option = typer.Option(*names, help=info.description, rich_help_panel=section, show_default=False)
    return inspect.Parameter(
        field, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[kind | None, option]
    )


def _config_parameter() -> inspect.Parameter:
    option = typer.Option(
        "--config", help=f"The fleet config file (TOML; {CONFIG_VARIABLE}); flags and variables override it."
    )
    return inspect.Parameter(
        CONFIG_FLAG, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[Path | None, option]
    )


def settings_fields(exclude: Iterable[str] = ()) -> dict[str, str]:
    """Every setting that becomes a flag, field -> its concern's section (``--help`` groups by it)."""
    left_out = set(exclude)
    return {
        field: concern.section
        for concern in Settings.concerns()
        for field in concern.model_fields
        if field not in left_out
    }


def settings_flags(exclude: Iterable[str] = ()) -> Callable[[Command], Command]:
    """Give a typer command a flag per setting (less ``exclude``) and ``--config``; the command takes
    ``settings_env``: the variables those given stand for (``FUSEFLEET_CONFIG`` for ``--config``)."""
    fields = settings_fields(exclude)

    def decorate(command: Command) -> Command:
        own = inspect.signature(command, eval_str=True)
        kept = [p for name, p in own.parameters.items() if name != SETTINGS_ENV]
        added = [_config_parameter(), *(_parameter(field, section) for field, section in fields.items())]

        @functools.wraps(command)
        def run(**given: Any) -> Any:
            env: dict[str, str] = {}
            config = given.pop(CONFIG_FLAG)
            if config is not None:
                env[CONFIG_VARIABLE] = str(config)
            for field in fields:
                value = given.pop(field)
                if value is not None:
                    env[ENV_PREFIX + field.upper()] = env_value(value)
            return command(**given, **{SETTINGS_ENV: env})

        parameters = [*kept, *added]
        run.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": own.return_annotation}
        del run.__wrapped__  # typer reads the signature above, not the command's own
        return run  # type: ignore[return-value]

    return decorate
