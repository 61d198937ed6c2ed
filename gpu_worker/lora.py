"""LoRA adapters on a loaded pipeline: one adapter for a whole call, or a different one (or none) per row.

Adapters live in ``lora_dir/<name>`` (the folder ``save_lora_weights`` writes). An adapter at a given scale is
loaded into the pipeline the first time a batch asks for it, under an internal adapter name of its own
(``fusefleet_<k>``: peft refuses names with dots, which LoRA names may have), with its scale set once; it stays
loaded, so later batches only switch, which costs milliseconds. One adapter at two scales is two such copies
(peft's scaling is per adapter); LoRA weights are small, and at most ``max_loaded`` copies are kept (the least
recently used ones not needed by the current call are deleted first).

Two ways to apply them:

* :meth:`LoraActivator.activate` makes one adapter the active one for every row (``set_adapters``), or disables
  every adapter for None, which gives back exactly the base model's outputs;
* :meth:`LoraActivator.mixed` applies a different adapter (or none) to each row of one pipeline call: for the
  duration of the call, a forward pre-hook on every peft ``LoraLayer`` of the pipeline's components passes peft's
  ``adapter_names`` (one adapter per batch row, ``"__base__"`` for none), so each layer computes the base output
  for the whole batch and adds each row's own adapter delta (peft's ``_mixed_batch_forward``), which is a solo
  run's arithmetic on a larger batch (equal to float rounding).

Batch layout (what :meth:`mixed` maps the rows onto): a layer that sees a batch of ``B`` (the call's rows: text
encoders, a denoiser without classifier-free guidance) gets the rows' adapters in row order; one that sees ``2B``
(a denoiser with classifier-free guidance: ``[unconditional rows..., conditional rows...]``) gets them twice in that
order. Any other batch size raises :class:`LoraMixingError` before the layer runs; the caller then runs the rows
grouped by adapter instead.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shared.contracts import LoraRef

log = logging.getLogger(__name__)

BASE_ADAPTER = "__base__"
"""peft's ``adapter_names`` entry for a row without adapter."""

MAX_LOADED = 16
"""Default bound on the (adapter, scale) copies kept loaded."""


class LoraMixingError(RuntimeError):
    """A LoRA layer saw a batch the rows' adapters cannot be mapped onto (neither the rows nor twice them)."""


def lora_layers(pipe: Any) -> list[Any]:
    """The peft ``LoraLayer`` modules of every torch component of ``pipe`` (denoiser, text encoders, ...)."""
    import torch
    from peft.tuners.lora import LoraLayer

    layers: list[Any] = []
    seen: set[int] = set()
    for component in getattr(pipe, "components", {}).values():
        if not isinstance(component, torch.nn.Module) or id(component) in seen:
            continue
        seen.add(id(component))
        layers.extend(module for module in component.modules() if isinstance(module, LoraLayer))
    return layers


def rows_for_batch(names: Sequence[str], batch: int) -> list[str]:
    """The adapter of each batch row of a layer's input of ``batch`` rows, for a call whose rows have ``names``:
    the rows themselves (``batch == len(names)``) or twice in order (``2 x``: classifier-free guidance's
    unconditional then conditional halves). One adapter for every row fits any batch."""
    if len(set(names)) == 1:
        return [names[0]] * batch
    if batch == len(names):
        return list(names)
    if batch == 2 * len(names):
        return [*names, *names]
    raise LoraMixingError(
        f"a LoRA layer saw a batch of {batch} inputs for a call of {len(names)} rows: cannot tell which adapter "
        "applies to which input"
    )


class LoraActivator:
    """The adapters loaded into ``pipe``, applied to a whole call (:meth:`activate`) or per row (:meth:`mixed`)."""

    def __init__(self, pipe: Any, lora_dir: Path | None, max_loaded: int = MAX_LOADED) -> None:
        self.pipe = pipe
        self.lora_dir = Path(lora_dir) if lora_dir is not None else None
        self.max_loaded = max(1, max_loaded)
        self._copies: OrderedDict[tuple[str, float], str] = OrderedDict()  # (name, scale) -> adapter, LRU last
        self._serial = 0
        self._enabled: bool | None = False  # None: unknown (right after a load)

    @property
    def loaded(self) -> frozenset[str]:
        """Names of the LoRA adapters loaded now (at one scale or more)."""
        return frozenset(name for name, _ in self._copies)

    @property
    def active(self) -> bool:
        """Whether an adapter may be active on the pipeline's layers now (its text encoders' included)."""
        return bool(self._copies) and self._enabled is not False

    @property
    def copies(self) -> int:
        """How many (adapter, scale) copies are loaded."""
        return len(self._copies)

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
            if self._copies and self._enabled is not False:
                self.pipe.disable_lora()
                self._enabled = False
            return
        adapter = self._load([lora])[0]
        self._enable()
        self.pipe.set_adapters([adapter], adapter_weights=[lora.scale])

    @contextmanager
    def mixed(self, loras: Sequence[LoraRef | None]) -> Iterator[None]:
        """For the ``with`` block (one pipeline call whose rows are ``loras``, in row order): each row computed
        with its own adapter at its own scale, or none. Loads what is missing first (FileNotFoundError /
        ValueError as :meth:`activate`). A layer whose batch does not fit the rows raises LoraMixingError."""
        names = self._load(loras)
        self._enable()
        handles = []

        def pass_adapters(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            x = args[0] if args else kwargs.get("x")
            if x is None:
                raise LoraMixingError(f"{type(module).__name__} called without its input")
            return args, {**kwargs, "adapter_names": rows_for_batch(names, len(x))}

        try:
            for layer in lora_layers(self.pipe):
                handles.append(layer.register_forward_pre_hook(pass_adapters, with_kwargs=True))
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _enable(self) -> None:
        if self._enabled is not True:
            self.pipe.enable_lora()
            self._enabled = True

    def _load(self, loras: Sequence[LoraRef | None]) -> list[str]:
        """The internal adapter name of each of ``loras`` (BASE_ADAPTER for None), loading what is missing and
        deleting the least recently used copies beyond ``max_loaded`` (never one of ``loras``)."""
        wanted = {(lora.name, lora.scale) for lora in loras if lora is not None}
        for key in wanted:
            if key in self._copies:
                self._copies.move_to_end(key)
                continue
            name, scale = key
            path = self.adapter_path(name)
            self._serial += 1
            adapter = f"fusefleet_{self._serial}"
            self.pipe.load_lora_weights(str(path), adapter_name=adapter)
            self.pipe.set_adapters([adapter], adapter_weights=[scale])  # the copy's scale, kept from now on
            self._copies[key] = adapter
            self._enabled = None  # whether loading enabled the layers is peft's business: set it next
        stale = [key for key in self._copies if key not in wanted][: max(0, len(self._copies) - self.max_loaded)]
        if stale:
            self.pipe.delete_adapters([self._copies.pop(key) for key in stale])
            log.info("LoRA copies deleted (least recently used): %s", stale)
        return [BASE_ADAPTER if lora is None else self._copies[(lora.name, lora.scale)] for lora in loras]
