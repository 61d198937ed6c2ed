"""The prompt-embedding cache on every family's tiny pipeline through the real runner: a batch encodes each
distinct prompt once, a forward from cached embeddings equals the one that encoded them exactly, and a solo
request's output is the same bit for bit with and without the cache (its row encoded alone either way)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.families import family_inputs, family_runner, family_specs, pixels
from gpu_worker.families import FAMILIES
from gpu_worker.prompt_cache import CachedEncoder

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("prompt-cache-models")


def _run(runner: Any, specs: Any) -> list[np.ndarray]:
    outputs = runner.run(specs, lambda step, total: False, family_inputs(specs))
    return [pixels(images[0]) for images in outputs]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_cached_forward_equals_uncached(family: str, cache_dir: Path) -> None:
    runner = family_runner(family, cache_dir)
    extra: dict[str, Any] = {"negative": "blurry"}
    if FAMILIES[family].traits.max_sequence_length is not None:
        extra["max_sequence_length"] = 32
    # the third request repeats the first's prompt; every row has the same negative prompt
    specs = family_specs(family, ["a red fox", "a blue whale", "a red fox"], side=32, steps=2, seed=7, **extra)
    first = _run(runner, specs)
    once = runner.prompt_cache.stats
    assert once.misses > 0 and once.hits > 0, f"{family}: the repeated prompt was encoded again ({once})"
    again = _run(runner, specs)
    twice = runner.prompt_cache.stats
    assert (twice.misses, twice.hits) == (once.misses, once.hits * 2 + once.misses), f"{family}: {twice}"
    for before, after in zip(first, again, strict=True):
        assert np.array_equal(before, after), f"{family}: a forward from cached embeddings differs"

    (cached,) = _run(runner, specs[:1])
    encoders = list({id(p): p for p in [runner.pipe, *runner._pipes.values()]}.values())
    originals = {}
    for pipe in encoders:
        assert isinstance(pipe.encode_prompt, CachedEncoder)
        originals[id(pipe)] = pipe.encode_prompt
        pipe.encode_prompt = pipe.encode_prompt.encode
    try:
        (uncached,) = _run(runner, specs[:1])
    finally:
        for pipe in encoders:
            pipe.encode_prompt = originals[id(pipe)]
    assert np.array_equal(cached, uncached), f"{family}: the cache changed a solo output"
