"""Approximate accelerations of a loaded pipeline, opt-in: they change what the forward computes, by a bounded and
measured amount (docs/models.md, "Per-GPU speed"). Both are off by default; with both off a pipeline is untouched.

Step caching (``step_cache``): some denoising steps reuse work of an earlier one.

* ``deepcache:<N>`` (UNet families: Stable Diffusion 1.x/2.x, SDXL): DeepCache. Every N-th UNet forward of a call
  runs in full; the others run only the outermost down block and up block and reuse the deep features (every other
  down block, the mid block, the inner up blocks) of the last full forward. A fixed schedule by step index, the same
  for every row, and each row's arithmetic is its own: **a row's output stays independent of its peers** (each row
  still equals its solo run within float rounding).
* ``taylorseer:<N>`` (transformer families: diffusers' TaylorSeer cache): steps 0-2 run in full, then every N-th
  step; the others predict each attention output by a first-order Taylor series over steps. A fixed schedule too:
  **peers independent**.
* ``first_block:<T>`` (transformer families: diffusers' first-block cache): a step skips all blocks but the first
  when the first block's residual changed by less than T (relative mean) since the last full step. The decision is
  taken once per forward over the **whole batch** (the hook compares the batch's mean), so with it **a row's output
  may depend on its peers** (which steps it skips), within the setting's documented deviation; a solo run decides
  for itself alone.

The setting may name several, comma-separated (``deepcache:3,taylorseer:4``): a model gets the first whose
denoiser it fits, so one fleet-wide value serves a fleet of UNet and transformer models; a model none fits runs
exactly (logged). A cached step's state is reset before every pipeline call. Step mode (``gpu_worker.step_engine``)
runs a set's rows at different steps through the denoiser directly, which a step cache cannot follow: a model with a
step cache applied runs its batches request-level.

Weight quantization (``weight_quantization``, the denoiser's linear layers): ``int8_weight`` and ``fp8_weight``
(int8 or fp8 e4m3 weights with one scale per output row, dequantized to the pipeline's dtype at each forward: the
weights' memory halved, not faster; on any device, ``QuantizedLinear``), ``fp8`` (torchao, an optional dependency:
fp8 weights and dynamically quantized fp8 activations, fp8 matmuls: the speed, on a CUDA GPU of compute capability
8.9 or newer only). Weights are scaled per output row and ``fp8``'s activations per token row (torchao's ``PerRow``
granularity), so no scale spans two requests: peers stay independent.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from shared.settings.acceleration import QUANTIZATIONS, StepCacheChoice, parse_step_cache

log = logging.getLogger(__name__)

PEER_INDEPENDENT = {"deepcache": True, "taylorseer": True, "first_block": False}
"""Whether a step cache keeps a row's output independent of its peers in the batch (a fixed schedule) or not (a
decision over the whole batch)."""

_TRANSFORMERS = ("transformer", "transformer_2")

TAYLORSEER_MODULES = (r"(transformer_blocks|single_transformer_blocks|blocks)\.\d+\.attn\d*",)
"""The modules whose outputs TaylorSeer predicts: every block's attention (``attn``, and ``attn1``/``attn2`` of
PixArt, Sana, LTX-Video and Wan, which diffusers' default pattern misses)."""


class DeepCache:
    """DeepCache on a ``UNet2DConditionModel``: while a call is on (``session``), its N-th forwards run in full
    and keep the outputs of the deep blocks; the others reuse them and compute only conv_in, the time embedding, the
    first down block, the last up block and conv_out. Outside a session the UNet runs exactly (the step engine's
    forwards)."""

    def __init__(self, unet: Any, interval: int) -> None:
        self.interval = interval
        self.active = False
        self.forwards = 0
        self.full = True
        self.outputs: dict[int, Any] = {}
        unet.register_forward_pre_hook(self._before_forward)
        deep = [*unet.down_blocks[1:], *([unet.mid_block] if unet.mid_block is not None else []), *unet.up_blocks[:-1]]
        for index, block in enumerate(deep):
            self._wrap(index, block)

    @staticmethod
    def fits(unet: Any) -> bool:
        """Whether ``unet`` has the down/mid/up structure DeepCache caches (a diffusers UNet2DConditionModel)."""
        return all(isinstance(getattr(unet, name, None), torch.nn.ModuleList) for name in ("down_blocks", "up_blocks"))

    def _before_forward(self, module: Any, args: Any) -> None:
        if self.active:
            self.full = self.forwards % self.interval == 0 or not self.outputs
            self.forwards += 1

    def _wrap(self, index: int, block: Any) -> None:
        original = block.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            if not self.active or self.full:
                output = original(*args, **kwargs)
                if self.active:
                    self.outputs[index] = output
                return output
            return self.outputs[index]

        block.forward = forward

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """One pipeline call: its first forward in full, the state dropped after."""
        self.active, self.forwards, self.outputs = True, 0, {}
        try:
            yield
        finally:
            self.active, self.outputs = False, {}


@dataclass
class Approximations:
    """What ``apply`` put on a pipeline: the step cache (None: none fits, or none asked) and the quantized
    components; ``call()`` wraps each pipeline call."""

    step_cache: StepCacheChoice | None = None
    quantized: tuple[str, ...] = ()
    weight_quantization: str = "off"
    _deepcache: DeepCache | None = None
    _pipe: Any = None

    @property
    def any(self) -> bool:
        return self.step_cache is not None or bool(self.quantized)

    @property
    def peer_independent(self) -> bool:
        """Whether every row's output still depends on its own request alone."""
        return self.step_cache is None or PEER_INDEPENDENT[self.step_cache.method]

    def describe(self) -> str:
        """One line for the log and the announcement: what is approximate here, and what that means for peers."""
        parts = []
        if self.step_cache is not None:
            peers = "rows independent of peers" if self.peer_independent else "a row may depend on its peers"
            parts.append(f"step cache {self.step_cache} ({peers})")
        if self.quantized:
            parts.append(f"{self.weight_quantization} weights in {', '.join(self.quantized)}")
        return "; ".join(parts) or "exact"

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """Around one pipeline call: the step cache's state starts fresh."""
        if self._deepcache is not None:
            with self._deepcache.session():
                yield
            return
        if self.step_cache is not None:
            from diffusers.hooks.hooks import HookRegistry

            for name in _TRANSFORMERS:
                module: Any = getattr(self._pipe, name, None)
                if isinstance(module, torch.nn.Module):
                    HookRegistry.check_if_exists_or_initialize(module).reset_stateful_hooks(recurse=True)
        yield


def _denoisers(pipe: Any) -> list[tuple[str, Any]]:
    return [
        (name, getattr(pipe, name))
        for name in ("unet", *_TRANSFORMERS)
        if isinstance(getattr(pipe, name, None), torch.nn.Module)
    ]


def _transformer_cache(module: Any, choice: StepCacheChoice, dtype: torch.dtype) -> bool:
    """Put ``choice`` (a diffusers cache hook) on a transformer; False where it does not fit that model. A model
    without diffusers' ``CacheMixin`` (SD3, PixArt, Sana in 0.42) gets the hook directly, and each of its forwards
    one cache context (its pipeline names none: one forward per step, the guidance rows in the same batch)."""
    hooks: Any = importlib.import_module("diffusers.hooks")
    config: Any
    hook: Any
    if choice.method == "first_block":
        config, hook = hooks.FirstBlockCacheConfig(threshold=choice.value), hooks.apply_first_block_cache
    else:
        config = hooks.TaylorSeerCacheConfig(
            cache_interval=int(choice.value), taylor_factors_dtype=dtype, cache_identifiers=list(TAYLORSEER_MODULES)
        )
        hook = hooks.apply_taylorseer_cache
    try:
        if hasattr(module, "enable_cache"):
            module.enable_cache(config)
        else:
            hook(module, config)
            from diffusers.hooks.hooks import CacheContext, _set_cache_context

            module.register_forward_pre_hook(lambda m, args: _set_cache_context(m, CacheContext("cond")))
            module.register_forward_hook(lambda m, args, output: _set_cache_context(m, None))
    except Exception as exc:  # noqa: BLE001 - the hook does not know this model's blocks: the next choice
        log.info("%s does not take %s (%s: %s)", type(module).__name__, choice, type(exc).__name__, exc)
        _remove_hooks(module)
        return False
    if not any(_hooks_of(child) for child in module.modules()):
        log.info("%s does not take %s: no module for it", type(module).__name__, choice)
        return False
    return True


def _hooks_of(module: Any) -> list[str]:
    """The diffusers hooks on ``module`` (not its children), by name."""
    from diffusers.hooks.hooks import HookRegistry

    registry = getattr(module, "_diffusers_hook", None)
    return list(registry.hooks) if isinstance(registry, HookRegistry) else []


def _remove_hooks(module: Any) -> None:
    """Take a step cache back off a transformer (one of two took it, or applying it failed half-way)."""
    if getattr(module, "is_cache_enabled", False):
        module.disable_cache()
        return
    for child in module.modules():
        for name in _hooks_of(child):
            child._diffusers_hook.remove_hook(name, recurse=False)


def apply_step_cache(pipe: Any, choices: tuple[StepCacheChoice, ...]) -> tuple[StepCacheChoice | None, Any]:
    """Put the first of ``choices`` that fits ``pipe``'s denoiser on it: the choice (None: none fits) and its
    DeepCache (None for a diffusers hook)."""
    denoisers = _denoisers(pipe)
    for choice in choices:
        if choice.method == "deepcache":
            unet = getattr(pipe, "unet", None)
            if isinstance(unet, torch.nn.Module) and DeepCache.fits(unet):
                return choice, DeepCache(unet, int(choice.value))
            continue
        transformers = [(name, module) for name, module in denoisers if name in _TRANSFORMERS]
        if transformers and all(_transformer_cache(m, choice, m.dtype) for _, m in transformers):
            return choice, None
        for _, module in transformers:  # one of two took it: leave neither half-cached
            _remove_hooks(module)
    return None, None


def torchao_available() -> bool:
    """Whether torchao (``weight_quantization=fp8``'s fp8 matmuls) is installed."""
    return importlib.util.find_spec("torchao") is not None


def fp8_matmuls(device: torch.device) -> bool:
    """Whether ``device`` runs fp8 matmuls (a CUDA GPU of compute capability 8.9 or newer: Ada, Hopper, ...)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


_STORAGE = {"int8_weight": (torch.int8, 127.0), "fp8_weight": (torch.float8_e4m3fn, 448.0)}
"""Each weight-only mode's storage dtype and its largest magnitude (a row's absolute maximum maps onto it)."""


class QuantizedLinear(torch.nn.Linear):
    """A ``Linear`` whose weight is kept quantized (``weight_q``: int8 or fp8 e4m3, one scale per output row in
    ``weight_scale``) and dequantized to the compute dtype at each forward; ``weight`` reads the dequantized one."""

    weight_q: torch.Tensor
    weight_scale: torch.Tensor
    compute_dtype: torch.dtype

    @classmethod
    def convert(cls, linear: torch.nn.Linear, mode: str) -> None:
        """Quantize ``linear`` in place (it becomes a ``QuantizedLinear``)."""
        storage, largest = _STORAGE[mode]
        weight = linear.weight.detach()
        scale = (weight.float().abs().amax(dim=1, keepdim=True) / largest).clamp(min=1e-12)
        scaled = weight.float() / scale
        quantized = scaled.round().clamp(-largest, largest).to(storage) if storage == torch.int8 else scaled.to(storage)
        module: Any = linear
        del module.weight
        module.__class__ = cls
        module.compute_dtype = weight.dtype
        module.register_buffer("weight_q", quantized)
        module.register_buffer("weight_scale", scale)

    @property
    def weight(self) -> torch.Tensor:  # type: ignore[override]
        return (self.weight_q.to(torch.float32) * self.weight_scale).to(self.compute_dtype)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(input, self.weight.to(input.dtype), self.bias)


def quantize_weights(pipe: Any, mode: str, device: torch.device) -> tuple[str, ...]:
    """Quantize the linear layers of ``pipe``'s denoiser(s) as ``mode`` says (``QUANTIZATIONS``); the components
    quantized. ``int8_weight`` and ``fp8_weight`` are this module's own (per-row symmetric scales, any device);
    ``fp8`` is torchao's fp8 weights and dynamic fp8 activations. ValueError naming ``weight_quantization`` where
    it cannot be done here."""
    if mode == "off":
        return ()
    if mode not in QUANTIZATIONS:
        raise ValueError(f"weight_quantization: {mode!r} is not one of {', '.join(QUANTIZATIONS)}")
    if mode == "fp8":
        if not fp8_matmuls(device):
            raise ValueError(
                "weight_quantization=fp8 needs a CUDA GPU of compute capability 8.9 or newer (this device: "
                f"{device}); fp8_weight stores fp8 weights anywhere (memory, not speed)"
            )
        if not torchao_available():
            raise ValueError("weight_quantization=fp8 needs torchao (pip install 'fusefleet[quant]'): not installed")
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

        for _, module in _denoisers(pipe):  # per-row scales: no activation scale spans two requests
            quantize_(module, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()))
        return tuple(name for name, _ in _denoisers(pipe))
    done = []
    for name, module in _denoisers(pipe):
        linears = [m for m in module.modules() if type(m) is torch.nn.Linear]
        for linear in linears:
            QuantizedLinear.convert(linear, mode)
        if linears:
            done.append(name)
    return tuple(done)


def apply(pipe: Any, step_cache: str, weight_quantization: str, device: torch.device) -> Approximations:
    """Apply the approximate accelerations the settings ask for to ``pipe`` (nothing at all when both are off)."""
    applied = Approximations(weight_quantization=weight_quantization, _pipe=pipe)
    applied.quantized = quantize_weights(pipe, weight_quantization, device)
    choices = parse_step_cache(step_cache)
    if choices:
        applied.step_cache, applied._deepcache = apply_step_cache(pipe, choices)
        if applied.step_cache is None:
            log.warning(
                "step_cache=%s: no choice fits %s's denoiser (%s): it runs without a step cache",
                step_cache,
                type(pipe).__name__,
                ", ".join(type(m).__name__ for _, m in _denoisers(pipe)),
            )
    if applied.any:
        log.warning("APPROXIMATE accelerations on %s: %s", type(pipe).__name__, applied.describe())
    return applied


DOCUMENTED_DEVIATION = {"deepcache": 8, "taylorseer": 4, "first_block": 16, "int8_weight": 2, "fp8_weight": 8}
"""The most a setting changes a pixel (/255) against the exact pipeline on the tiny demo models of
tests/integration/test_approximations.py (32 px, 8 steps; deepcache and the weight modes on Stable Diffusion,
taylorseer on Flux and SD3, first_block on Flux): what docs/models.md states and the test holds each setting to.
Random tiny weights are not a real model's: bench/accel.py measures a real architecture's deviation on a GPU."""
