"""The client, the scheduler, the worker and ``shared`` depend on the protocol (``shared``), never on the api: none
of their modules imports ``api`` (not even for type checking or inside a function), and importing the client loads
no module of it. The demo models (``demo_models``) are no product package: only the diffusers runner imports them,
inside the function that serves the demo, and they import no product package."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WITHOUT_API = (
    *sorted((ROOT / "fusefleet").glob("client*.py")),
    ROOT / "fusefleet" / "keys_cli.py",
    *(path for package in ("scheduler", "gpu_worker", "shared") for path in sorted((ROOT / package).rglob("*.py"))),
)
CLIENT_MODULES = ("fusefleet.client", "fusefleet.client_cli", "fusefleet.client_events", "fusefleet.client_errors")


def _imported(path: Path) -> set[str]:
    """Every module an import statement of ``path`` names, wherever the statement is."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
    return names


def _is_api(name: str) -> bool:
    return name == "api" or name.startswith("api.")


def test_the_rule_sees_imports_of_the_api_anywhere(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from api.schemas import X\n")
    assert any(_is_api(name) for name in _imported(source))
    source.write_text("def f():\n    import api.app\n")
    assert any(_is_api(name) for name in _imported(source))
    source.write_text("from apis import x\nimport shared.wire\n")
    assert not any(_is_api(name) for name in _imported(source))


def test_no_client_scheduler_worker_or_shared_module_imports_the_api() -> None:
    assert len(WITHOUT_API) > 40  # the globs found the packages
    offenders = {
        str(path.relative_to(ROOT)): sorted(filter(_is_api, _imported(path)))
        for path in WITHOUT_API
        if any(_is_api(name) for name in _imported(path))
    }
    assert offenders == {}


def test_importing_the_client_loads_no_api_module() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {CLIENT_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'api' or m.startswith('api.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


PRODUCT = tuple(
    path
    for package in ("api", "scheduler", "gpu_worker", "shared", "fusefleet")
    for path in (ROOT / package).rglob("*.py")
)


def _is_demo(name: str) -> bool:
    return name == "demo_models" or name.startswith("demo_models.")


def _module_level_imports(path: Path) -> set[str]:
    """The modules ``path`` imports outside any function (at import time)."""
    names: set[str] = set()
    pending: list[ast.AST] = [ast.parse(path.read_text(), str(path))]
    while pending:
        for node in ast.iter_child_nodes(pending.pop()):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module)
            pending.append(node)
    return names


def test_the_product_imports_the_demo_models_only_to_serve_the_demo(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from demo_models import ensure_demo_model\n")
    assert not any(map(_is_demo, _module_level_imports(source)))
    source.write_text("if True:\n    import demo_models.sd3\n")
    assert any(map(_is_demo, _module_level_imports(source)))
    assert len(PRODUCT) > 60  # the globs found the packages
    offenders = {
        str(path.relative_to(ROOT)): sorted(filter(_is_demo, _module_level_imports(path)))
        for path in PRODUCT
        if any(map(_is_demo, _module_level_imports(path)))
    }
    assert offenders == {}
    users = {str(path.relative_to(ROOT)) for path in PRODUCT if any(map(_is_demo, _imported(path)))}
    assert users == {"gpu_worker/diffusers_runner.py"}


def test_the_demo_models_import_no_product_package() -> None:
    product = ("api", "scheduler", "gpu_worker", "shared", "fusefleet")
    imported = {name for path in (ROOT / "demo_models").glob("*.py") for name in _imported(path)}
    assert "demo_models.components" in imported  # the glob found the package
    assert {name for name in imported if name.split(".")[0] in product} == set()
