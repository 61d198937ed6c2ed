"""Exact accelerations of a loaded pipeline: what changes how the forward is computed, never what it computes.

* channels-last memory format for the convolutional components (the UNet, the VAE): the same arithmetic in the
  layout the GPU's convolution kernels prefer (``channels_last``; unset: on a CUDA device only);
* the scaled-dot-product-attention backend (``sdpa_backend``: auto lets torch choose; flash, efficient, cudnn or
  math pin one), applied around every forward (``attention``);
* regional ``torch.compile`` of the denoiser (``compile_denoiser``): only its repeated blocks (diffusers'
  ``compile_repeated_blocks``; a family that names none has its ``transformer_blocks`` compiled one by one), so
  compile time is that of one block; compiled artifacts kept in ``compile_cache_dir`` across restarts (inductor's
  cache). With compilation on, a forward's rows are padded up to the next batch bucket (``buckets``: the sizes the
  batch knee measures, ``gpu_worker.batch_knee.measured_sizes``) so each bucket is one static shape compiled
  once; the padding rows are dropped from the outputs and never reach a result (``DiffusersRunner._call``).
  Every compiled block shares one code object, and each (block shape, bucket, request size) is one more compiled
  graph of it: a UNet's blocks come in several widths, so SD 1.5 with five buckets needs 20 where dynamo's
  default allows 8 (with ``fullgraph`` a hard error at the ninth). ``compile_denoiser`` raises that limit to
  ``RECOMPILE_LIMIT``.

Every row still equals its solo run (compiled vs compiled) within 1/255: ``tests/integration/test_accelerations.py``.
The approximate accelerations (step caching, weight quantization) are ``gpu_worker.approximations``'; they are put on
before the denoiser is compiled, and a step cache's hooks make its blocks compile with graph breaks allowed.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

SDPA_BACKENDS = ("auto", "flash", "efficient", "cudnn", "math")
"""The ``sdpa_backend`` values: torch's own choice, or one backend pinned."""

DENOISERS = ("unet", "transformer", "transformer_2")
"""The pipeline components a family's denoiser is (Wan 2.2 has two transformers)."""

RECOMPILE_LIMIT = 256
"""The compiled graphs one code object (the blocks' ``forward``) may hold: distinct block shapes (a UNet has about
four) times batch buckets (up to ``max_num_seqs``' powers of two) times the request sizes served. dynamo's default
is 8; past the limit a ``fullgraph`` block fails its forward."""


def use_channels_last(pipe: Any) -> list[str]:
    """Put the 2-D convolutional components of ``pipe`` (its UNet, its image VAE) in channels-last memory format;
    the names of those changed. A component with 3-D convolutions (a video VAE) is left as it is: channels-last is a
    4-D format."""
    changed = []
    for name in ("unet", "vae"):
        if isinstance(getattr(pipe, name, None), torch.nn.Module):
            module: Any = getattr(pipe, name)
            if any(parameter.dim() == 5 for parameter in module.parameters()):
                continue
            module.to(memory_format=torch.channels_last)
            changed.append(name)
    return changed


@contextlib.contextmanager
def attention(backend: str) -> Iterator[None]:
    """Every scaled-dot-product attention within runs on ``backend`` (``auto``: torch's choice)."""
    if backend == "auto":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }[backend]
    with sdpa_kernel([chosen]):
        yield


def _hooked(module: Any) -> bool:
    """Whether a diffusers hook (a step cache's: ``gpu_worker.approximations``) sits on ``module`` or within it."""
    return any(
        getattr(child, "_diffusers_hook", None) is not None and child._diffusers_hook.hooks
        for child in module.modules()
    )


def _allow_recompiles(limit: int) -> None:
    """Let one code object hold ``limit`` compiled graphs (``RECOMPILE_LIMIT``), and all of them together more."""
    import torch._dynamo.config as dynamo

    for name in ("recompile_limit", "cache_size_limit"):  # the newer name, the older one (torch < 2.6)
        if isinstance(getattr(dynamo, name, None), int):
            setattr(dynamo, name, max(getattr(dynamo, name), limit))
            break
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if isinstance(getattr(dynamo, name, None), int):
            setattr(dynamo, name, max(getattr(dynamo, name), 4 * limit))
            break


def compile_denoiser(pipe: Any, cache_dir: Path | None, backend: str = "inductor") -> list[str]:
    """Compile the repeated blocks of ``pipe``'s denoiser(s) (regional compilation) with ``backend``; inductor's
    cache in ``cache_dir``. The names of the components compiled (none: nothing to compile, logged). A denoiser with
    a step cache's diffusers hooks in its blocks is compiled with graph breaks allowed (the hooks decide outside the
    graph, ``torch.compiler.disable``); otherwise each block is one graph (``fullgraph``). Raises dynamo's recompile
    limit to ``RECOMPILE_LIMIT`` (process-wide)."""
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir))
        os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    _allow_recompiles(RECOMPILE_LIMIT)
    compiled = []
    for name in DENOISERS:
        if not isinstance(getattr(pipe, name, None), torch.nn.Module):
            continue
        module: Any = getattr(pipe, name)
        blocks: Any = getattr(module, "transformer_blocks", None)
        fullgraph = not _hooked(module)
        if getattr(module, "_repeated_blocks", None):
            module.compile_repeated_blocks(fullgraph=fullgraph, dynamic=False, backend=backend)
        elif isinstance(blocks, torch.nn.ModuleList):
            for block in blocks:
                block.compile(fullgraph=fullgraph, dynamic=False, backend=backend)
        else:
            log.warning("%s.%s has no repeated blocks to compile: it runs eagerly", type(pipe).__name__, name)
            continue
        compiled.append(name)
    return compiled


def bucket(rows: int, buckets: Sequence[int]) -> int:
    """The batch a forward of ``rows`` rows is padded to: the smallest bucket that holds it (``rows`` itself above
    the largest)."""
    return min((size for size in buckets if size >= rows), default=rows)
