"""Switching a loaded pipeline between its bare base model and one LoRA adapter at a given scale.

Adapters live in ``lora_dir/<name>`` (the folder ``save_lora_weights`` writes). Each is loaded into the
pipeline the first time a batch asks for it and stays loaded; later batches only switch adapters and scales,
which costs milliseconds. A batch without LoRA disables every adapter, which gives back exactly the base
model's outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared.contracts import LoraRef


class LoraActivator:
    """Keeps track of the adapters loaded into ``pipe`` and which one (if any) is active."""

    def __init__(self, pipe: Any, lora_dir: Path | None) -> None:
        self.pipe = pipe
        self.lora_dir = Path(lora_dir) if lora_dir is not None else None
        self._loaded: set[str] = set()
        self._enabled = False

    @property
    def loaded(self) -> frozenset[str]:
        """Names of the adapters loaded so far (never unloaded)."""
        return frozenset(self._loaded)

    def adapter_path(self, name: str) -> Path:
        """The folder of adapter ``name``; raises when the LoRA folder is unset or the adapter is missing."""
        if self.lora_dir is None:
            raise ValueError(f"LoRA {name!r} requested but no LoRA folder is configured (FUSEFLEET_LORA_DIR)")
        path = self.lora_dir / name
        if not path.is_dir():
            raise FileNotFoundError(f"LoRA {name!r} not found: no folder {path}")
        return path

    def activate(self, lora: LoraRef | None) -> None:
        """Make ``lora`` (at its scale) the only active adapter, or restore the bare base model for None."""
        if lora is None:
            if self._loaded and self._enabled:
                self.pipe.disable_lora()
                self._enabled = False
            return
        if lora.name not in self._loaded:
            self.pipe.load_lora_weights(str(self.adapter_path(lora.name)), adapter_name=lora.name)
            self._loaded.add(lora.name)
            self._enabled = True  # a fresh load enables the adapter layers
        if not self._enabled:
            self.pipe.enable_lora()
            self._enabled = True
        self.pipe.set_adapters([lora.name], adapter_weights=[lora.scale])
