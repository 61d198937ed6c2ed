"""The contributor's guide cannot rot: every path CONTRIBUTING.md and the architecture's "where new things go"
name exists, and the pre-commit hooks run exactly the commands of ``make check``."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

_CODE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FILE_SUFFIXES = {".py", ".md", ".lua", ".toml", ".yaml", ".yml", ".json", ".example", ".cfg", ".txt"}


def _named_paths(text: str, links_from: str = "") -> set[str]:
    """Backticked spans that are paths (a ``/`` or a file suffix, no spaces, no placeholder), and relative link
    targets without their anchor (below ``links_from``, the folder of the document they are in)."""
    paths = set()
    for span in _CODE.findall(text):
        path = span.split("::")[0].removeprefix("./")
        if re.search(r"[\s<>*{}$()\[\]]", path) or path.startswith(("-", ":")):
            continue
        if "/" in path or Path(path).suffix in _FILE_SUFFIXES:
            paths.add(path)
    for target in _LINK.findall(text):
        if "://" not in target and not target.startswith("#"):
            paths.add(links_from + target.split("#")[0])
    return paths


def test_the_path_finder_sees_paths_not_commands() -> None:
    text = "`make unit` `a/b.py::test_x` `./c.md` `lib_<name>.lua` `.venv/bin/ruff format` `x.y()` [d](e/f.md#g)"
    assert _named_paths(text) == {"a/b.py", "c.md", "e/f.md"}


def test_every_path_contributing_names_exists() -> None:
    named = _named_paths(CONTRIBUTING.read_text(encoding="utf-8"))
    assert len(named) > 20, "the guide names the files it is about"
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert missing == [], f"CONTRIBUTING.md names paths that do not exist: {missing}"


def test_every_path_where_new_things_go_names_exists() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text[text.index("## Where new things go") :].split("\n## ")[0]
    named = _named_paths(section, links_from="docs/")
    assert len(named) > 20, "the section names the files each extension touches"
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert missing == [], f"docs/architecture.md's 'Where new things go' names paths that do not exist: {missing}"


def _make_check_commands() -> list[str]:
    """The recipe of the Makefile's ``check`` target, with ``$(BIN)`` as its default, ``.venv/bin``."""
    lines = (ROOT / "Makefile").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("check:"))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip().replace("$(BIN)", ".venv/bin"))
    return recipe


def test_pre_commit_runs_what_make_check_runs() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    (repo,) = config["repos"]
    assert repo["repo"] == "local", "no hook repository fetched over the network"
    hooks = repo["hooks"]
    assert all(hook["language"] == "system" and hook["pass_filenames"] is False for hook in hooks)
    assert [hook["entry"] for hook in hooks] == _make_check_commands()
