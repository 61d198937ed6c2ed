"""The prompt cache's pure parts on a fake encoder: bounds by entries and bytes (least recently used out first),
rows looked up one by one and only the misses encoded, the batch assembled as the encoder returns it, and calls
it cannot key passed through."""

from __future__ import annotations

from typing import Any

import torch

from gpu_worker.prompt_cache import PromptCache, install


class FakePipe:
    """An ``encode_prompt`` of the diffusers shape: a row tensor per prompt (its texts' lengths), one shared."""

    def __init__(self) -> None:
        self.encoded: list[list[str]] = []

    def encode_prompt(
        self,
        prompt: Any,
        device: Any = None,
        num_images_per_prompt: int = 1,
        negative_prompt: Any = None,
        prompt_embeds: Any = None,
        max_sequence_length: int = 8,
    ) -> tuple[Any, ...]:
        prompts = [prompt] if isinstance(prompt, str) else list(prompt or [])
        negatives = negative_prompt if isinstance(negative_prompt, list) else [negative_prompt] * len(prompts)
        self.encoded.append(prompts)
        cond = torch.tensor([[float(len(p)), float(max_sequence_length)] for p in prompts])
        uncond = torch.tensor([[float(len(n or ""))] for n in negatives])
        return cond, uncond, torch.arange(3.0)


def _cache(entries: int = 16, max_bytes: int = 1 << 20) -> PromptCache:
    return PromptCache(entries, max_bytes)


def test_a_batch_encodes_only_its_misses_and_equals_the_encoders_batch() -> None:
    pipe, cache = FakePipe(), _cache()
    reference = FakePipe().encode_prompt(["ab", "c", "ab"], negative_prompt="xyz")
    assert install(pipe, cache)
    first = pipe.encode_prompt(["ab", "c", "ab"], negative_prompt="xyz")
    assert pipe.encoded == [["ab"], ["c"]]  # "ab" twice in one batch: encoded once
    second = pipe.encode_prompt(["c", "ab", "dddd"], negative_prompt="xyz")
    assert pipe.encoded[2:] == [["dddd"]]
    for got, want in zip(first, reference, strict=True):
        assert torch.equal(got, want)
    assert torch.equal(second[0], torch.tensor([[1.0, 8.0], [2.0, 8.0], [4.0, 8.0]]))
    assert torch.equal(second[2], torch.arange(3.0))  # shared, not one per row
    stats = cache.stats
    assert (stats.hits, stats.misses, stats.entries) == (3, 3, 3) and stats.hit_rate == 0.5


def test_every_other_argument_is_part_of_the_key() -> None:
    pipe, cache = FakePipe(), _cache()
    install(pipe, cache)
    pipe.encode_prompt(["ab"], negative_prompt="n")
    pipe.encode_prompt(["ab"], negative_prompt="other")
    out = pipe.encode_prompt(["ab"], negative_prompt="n", max_sequence_length=4)
    assert len(pipe.encoded) == 3 and out[0][0, 1] == 4.0


def test_calls_it_cannot_key_pass_through_uncounted() -> None:
    pipe, cache = FakePipe(), _cache()
    bypassed = [False]
    install(pipe, cache, bypass=lambda: bypassed[0])
    pipe.encode_prompt(["a", "b"], num_images_per_prompt=2)
    pipe.encode_prompt(None, prompt_embeds=torch.zeros(1, 2))
    bypassed[0] = True
    pipe.encode_prompt(["a", "b"])
    assert pipe.encoded == [["a", "b"], [], ["a", "b"]]
    assert cache.stats.hits == cache.stats.misses == cache.stats.entries == 0


def test_bounded_by_entries_least_recently_used_first() -> None:
    cache = _cache(entries=2)
    row = (torch.zeros(1, 4),)
    cache.put("a", row)
    cache.put("b", row)
    assert cache.get("a") is row  # now b is the least recently used
    cache.put("c", row)
    assert cache.get("b") is None and cache.get("a") is row and cache.get("c") is row


def test_bounded_by_bytes_and_a_row_over_the_bound_is_not_kept() -> None:
    cache = _cache(max_bytes=40)
    cache.put("a", (torch.zeros(1, 4), None))  # 16 bytes
    cache.put("b", (torch.zeros(1, 4),))
    cache.put("c", (torch.zeros(1, 4),))  # 48 > 40: a goes
    assert cache.get("a") is None and cache.stats.bytes == 32
    cache.put("huge", (torch.zeros(1, 11),))
    assert cache.get("huge") is None and cache.stats.entries == 2


def test_no_entries_keeps_nothing() -> None:
    cache = _cache(entries=0)
    cache.put("a", (torch.zeros(1),))
    assert cache.get("a") is None


def test_rows_of_different_lengths_are_encoded_by_the_family_call() -> None:
    class RaggedPipe(FakePipe):
        def encode_prompt(self, prompt: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
            self.encoded.append(list(prompt))
            return (torch.ones(len(prompt), max(len(p) for p in prompt)),)

    pipe, cache = RaggedPipe(), _cache()
    install(pipe, cache)
    (embeds,) = pipe.encode_prompt(["ab", "abcd"])
    assert pipe.encoded == [["ab"], ["abcd"], ["ab", "abcd"]] and embeds.shape == (2, 4)
    assert cache.stats.misses == 2 and cache.stats.entries == 2
    (alone,) = pipe.encode_prompt(["abcd"])
    assert alone.shape == (1, 4) and len(pipe.encoded) == 3 and cache.stats.hits == 1


def test_a_mismatched_negative_list_passes_through() -> None:
    pipe, cache = FakePipe(), _cache()
    install(pipe, cache)
    pipe.encode_prompt(["a", "b"], negative_prompt=["n"])  # the encoder's to refuse, as without the cache
    assert pipe.encoded == [["a", "b"]] and cache.stats.entries == 0
