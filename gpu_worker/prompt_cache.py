"""The prompt-embedding cache: each prompt (with its negative prompt) encoded once per model and encoder settings.

``PromptCache`` is an LRU of a pipeline's ``encode_prompt`` outputs for one row, bounded by entries and by bytes
(``prompt_cache_entries``, ``prompt_cache_mb``). ``install`` wraps a pipeline's ``encode_prompt`` (the one place
every family encodes: its ``__call__`` and the step engine both call it), so a batch of prompts is looked up row
by row, only the misses are encoded, and the rows are assembled into the tensors the family's own batched call
would have returned (a tensor of one row per row concatenated; one shared by every row, as Flux's ``text_ids``,
taken once). Rows of different lengths (Qwen-Image trims its embeddings to a batch's longest prompt, and drops a
mask of all ones) are not assembled: such a batch is encoded by the family's own call, its lookups counted as
misses, while its rows stay cached for requests alone and for batches of one length.

Exactness: a miss is encoded alone (one row, as a solo request encodes it), so a hit returns the encoder's own
output for that row bit for bit, and a cached forward equals an uncached one exactly
(``tests/integration/test_prompt_cache.py``, per family).

The key is the row's prompts (``prompt``, ``prompt_2``, ``prompt_3`` and their negatives) and every other
argument of the call (classifier-free guidance, ``max_sequence_length``, ``clip_skip``, ``lora_scale``, dtype,
device, ...). A call the cache cannot key (precomputed embeddings, an unhashable argument, several outputs per
prompt) or made while ``bypass()`` says so (a LoRA adapter active, which may change the text encoders) is passed
through untouched and counts neither as a hit nor as a miss.
"""

from __future__ import annotations

import inspect
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

ROW_ARGUMENTS = ("prompt", "prompt_2", "prompt_3", "negative_prompt", "negative_prompt_2", "negative_prompt_3")
"""The arguments of ``encode_prompt`` that hold one text per row (a list, or one text for every row)."""

PER_PROMPT_ARGUMENTS = ("num_images_per_prompt", "num_videos_per_prompt")
"""Outputs per prompt: the cache serves calls with one (the runner's; several repeat rows, so pass through)."""

Encoded = tuple[Any, ...]
"""What ``encode_prompt`` returns for one row: tensors (or None), in the family's order."""


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Lookups so far: rows found (in the cache, or earlier in the same batch), rows encoded, and what is held."""

    hits: int
    misses: int
    entries: int
    bytes: int

    @property
    def hit_rate(self) -> float:
        """Hits over lookups (0 before the first)."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0


def encoded_bytes(encoded: Encoded) -> int:
    """The bytes the tensors of ``encoded`` hold."""
    return sum(item.numel() * item.element_size() for item in encoded if isinstance(item, torch.Tensor))


class PromptCache:
    """An LRU of encoded rows, at most ``max_entries`` of them and ``max_bytes`` of tensors (an entry larger than
    that is not kept). Thread-safe. ``on_lookup(hits, misses)`` is told after each cached call."""

    def __init__(self, max_entries: int, max_bytes: int, on_lookup: Callable[[int, int], None] | None = None) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.on_lookup = on_lookup
        self._entries: OrderedDict[Hashable, tuple[Encoded, int]] = OrderedDict()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Encoded | None:
        """The row stored under ``key`` (now the most recently used), or None."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            return found[0]

    def put(self, key: Hashable, encoded: Encoded) -> None:
        """Keep ``encoded`` under ``key``, evicting the least recently used rows beyond the bounds."""
        size = encoded_bytes(encoded)
        if self.max_entries < 1 or size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (encoded, size)
            self._bytes += size
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted

    def count(self, hits: int, misses: int) -> None:
        """Record one cached call's lookups (and tell ``on_lookup``)."""
        with self._lock:
            self._hits += hits
            self._misses += misses
        if self.on_lookup is not None:
            self.on_lookup(hits, misses)

    def clear(self) -> None:
        """Drop every row (the counts stay)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    @property
    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, len(self._entries), self._bytes)


def _row_texts(value: Any, rows: int) -> list[Any]:
    """One text (or None) per row of a row argument: a list as given, one text for all."""
    if isinstance(value, list | tuple):
        if len(value) != rows:
            raise ValueError(f"{len(value)} texts for {rows} prompts")
        return list(value)
    return [value] * rows


def _freeze(value: Any) -> Hashable:
    """``value`` as part of a key; TypeError when it cannot be one."""
    if isinstance(value, list | tuple):
        return tuple(_freeze(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((name, _freeze(item)) for name, item in value.items()))
    if isinstance(value, torch.Tensor):
        raise TypeError("a tensor argument")
    hash(value)
    return value  # type: ignore[no-any-return]


class RaggedRows(ValueError):
    """Rows whose tensors differ in length: only the family's own batched encoder knows how to pad them."""


def assemble(rows: Sequence[Encoded]) -> Encoded:
    """The batch ``encode_prompt`` output of ``rows`` (each a one-row output, in the same order): one-row tensors
    concatenated, anything else taken from the first; RaggedRows where one-row tensors differ in shape."""
    first = rows[0]
    out: list[Any] = []
    for position, head in enumerate(first):
        items = [row[position] for row in rows]
        if not isinstance(head, torch.Tensor) or head.dim() == 0 or head.shape[0] != 1:
            out.append(head)
            continue
        if any(item.shape != head.shape for item in items):
            raise RaggedRows(f"rows of shapes {sorted({tuple(item.shape) for item in items})}")
        out.append(torch.cat(items, dim=0))
    return tuple(out)


class CachedEncoder:
    """A pipeline's ``encode_prompt``, looked up row by row in a ``PromptCache`` (``install`` puts it in place)."""

    def __init__(self, encode: Callable[..., Any], cache: PromptCache, bypass: Callable[[], bool]) -> None:
        self.encode = encode
        self.cache = cache
        self.bypass = bypass
        self.signature = inspect.signature(encode)
        self.spread = [name for name, p in self.signature.parameters.items() if p.kind is inspect.Parameter.VAR_KEYWORD]
        """A ``**kwargs`` parameter (PixArt's): its contents are passed on as keywords."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.bypass():
            return self.encode(*args, **kwargs)
        bound = self.signature.bind(*args, **kwargs)
        arguments = dict(bound.arguments)
        for name in self.spread:
            arguments.update(arguments.pop(name, {}))
        plan = self._plan(arguments)
        if plan is None:
            return self.encode(*args, **kwargs)
        rows, keys = plan
        found: list[Encoded | None] = [self.cache.get(key) for key in keys]
        encoded: dict[Hashable, Encoded] = {}
        for i, key in enumerate(keys):
            if found[i] is None and key not in encoded:  # a prompt twice in one batch is encoded once
                alone = {name: [texts[i]] for name, texts in rows.items()}
                result = self.encode(**{**arguments, **alone})
                encoded[key] = tuple(result)
                self.cache.put(key, encoded[key])
        try:
            batch = assemble(
                [item if item is not None else encoded[key] for item, key in zip(found, keys, strict=True)]
            )
        except RaggedRows:
            self.cache.count(0, len(keys))
            return self.encode(*args, **kwargs)
        self.cache.count(len(keys) - len(encoded), len(encoded))
        return batch

    def _plan(self, arguments: dict[str, Any]) -> tuple[dict[str, list[Any]], list[Hashable]] | None:
        """Each row argument split per row, and each row's key; None for a call the cache does not serve."""
        prompt = arguments.get("prompt")
        if prompt is None or any(arguments.get(name, 1) != 1 for name in PER_PROMPT_ARGUMENTS):
            return None
        count = len(prompt) if isinstance(prompt, list | tuple) else 1
        if count == 0:
            return None
        try:
            # an absent text (None) stays one None: a family reads it as "the prompt" (``prompt_2 or prompt``)
            rows = {
                name: _row_texts(arguments[name], count) for name in ROW_ARGUMENTS if arguments.get(name) is not None
            }
            rest = {name: value for name, value in arguments.items() if name not in rows}
            if any(name.endswith(("_embeds", "_mask")) and value is not None for name, value in rest.items()):
                return None  # precomputed embeddings: nothing to encode
            settings = _freeze(rest)
            keys: list[Hashable] = [
                (settings, tuple((name, _freeze(texts[i])) for name, texts in rows.items())) for i in range(count)
            ]
        except (TypeError, ValueError):  # an unhashable argument, or a texts list that does not fit: the encoder's
            return None
        return rows, keys


def install(pipe: Any, cache: PromptCache, bypass: Callable[[], bool] = lambda: False) -> bool:
    """Look ``pipe``'s prompts up in ``cache`` (its ``encode_prompt`` replaced on the instance); False where the
    pipeline has no ``encode_prompt`` (nothing done)."""
    encode = getattr(pipe, "encode_prompt", None)
    if encode is None or isinstance(encode, CachedEncoder):
        return isinstance(encode, CachedEncoder)
    pipe.encode_prompt = CachedEncoder(encode, cache, bypass)
    return True
