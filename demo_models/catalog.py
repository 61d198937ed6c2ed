"""The demo models by family: which function builds each family's tiny pipeline (``DEMO_FAMILIES``), and the
model cache that builds one once and saves it (``ensure_demo_model``), safe across processes.

The worker serves one when ``FUSEFLEET_MODEL`` is unset (``FUSEFLEET_DEMO_FAMILY`` picks it, default Stable
Diffusion 1.x); weights come from a fixed torch seed, so every process builds byte-identical ones.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEMO_MODEL_NAME = "demo"
"""The ``RequestSpec.model`` value that selects the demo model."""

DEMO_MODEL_DIRNAME = "demo-sd-v1"
DEFAULT_DEMO_FAMILY = "stable-diffusion"
DEMO_FAMILIES: dict[str, str] = {
    "stable-diffusion": "demo_models.stable_diffusion:build",
    "stable-diffusion-xl": "demo_models.sdxl:build",
    "stable-diffusion-3": "demo_models.sd3:build",
    "flux": "demo_models.flux:build",
    "pixart": "demo_models.pixart:build",
    "sana": "demo_models.sana:build",
    "qwen-image": "demo_models.qwen_image:build",
    "ltx-video": "demo_models.video:build",
    "wan": "demo_models.wan:build",
    "wan-i2v": "demo_models.wan_i2v:build",
}
"""Family name (as ``gpu_worker.families`` names it) -> 'module:function' building its tiny pipeline."""
_MARKER = "model_index.json"


def demo_builder(family: str) -> Callable[[], Any]:
    """The function that builds ``family``'s tiny pipeline; ValueError listing the families when unknown."""
    try:
        module_name, _, function = DEMO_FAMILIES[family].partition(":")
    except KeyError:
        known = ", ".join(sorted(DEMO_FAMILIES))
        raise ValueError(f"unknown demo family {family!r} (FUSEFLEET_DEMO_FAMILY); known: {known}") from None
    builder: Callable[[], Any] = getattr(importlib.import_module(module_name), function)
    return builder


def demo_model_dir(cache_dir: Path, family: str = DEFAULT_DEMO_FAMILY) -> Path:
    """Where ``family``'s demo pipeline is saved under ``cache_dir``: ``demo-sd-v1`` for the default, ``demo-<family>``
    otherwise."""
    return Path(cache_dir) / (DEMO_MODEL_DIRNAME if family == DEFAULT_DEMO_FAMILY else f"demo-{family}")


def save_once(target: Path, build: Callable[[], Any]) -> bool:
    """Save the pipeline ``build()`` returns as the folder ``target`` unless one is there already; whether it was
    built now.

    Idempotent and safe across processes: the pipeline is saved into a temporary sibling folder and renamed into
    place (a half-written folder is never used); when another process won the race, its copy (identical bytes) is
    kept and ours discarded.
    """
    if (target / _MARKER).is_file():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared by the workers of a host
        build().save_pretrained(tmp, safe_serialization=True)
        try:
            os.rename(tmp, target)
        except OSError:
            # Target exists: a concurrent builder finished first (or a stale partial dir without the marker).
            if not (target / _MARKER).is_file():
                shutil.rmtree(target, ignore_errors=True)
                os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def ensure_demo_model(cache_dir: Path, family: str = DEFAULT_DEMO_FAMILY) -> Path:
    """The folder of ``family``'s demo pipeline under ``cache_dir`` (:func:`demo_model_dir`), built and saved there
    first if it is missing (:func:`save_once`); ValueError for an unknown family."""
    build = demo_builder(family)
    target = demo_model_dir(cache_dir, family)
    save_once(target, build)
    return target
