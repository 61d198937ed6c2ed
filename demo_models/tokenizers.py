"""Tiny tokenizers built offline, one per text-encoder family the tiny pipelines use.

Each covers a few dozen English words (the prompts of tests and demos) plus single characters, so any prompt
tokenizes, and saves and loads through the real ``from_pretrained`` path like a downloaded one.
"""

from __future__ import annotations

from typing import Any

CLIP_WORDS = (
    "a photo of the cat dog red blue green sky sea tree house car portrait painting mountain forest city "
    "night day sun moon flower bird fish river in on with and style art"
).split()
"""The words :func:`clip_tokenizer` has whole (a longer list would change its vocabulary, so every CLIP text
encoder's weights: the tiny pipelines' weights are pinned)."""
WORDS = [*CLIP_WORDS, "fox", "whale", "lighthouse"]
"""The words the other tokenizers have whole."""
LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789"
CLIP_VOCAB_SIZE = 1000
"""The Stable Diffusion demo's text-encoder rows (diffusers' test size); :func:`clip_tokenizer`'s vocabulary fits."""
_CLIP_SPECIAL_TOKENS = ("<|startoftext|>", "<|endoftext|>")  # ids 0 (bos) and 1 (eos = pad)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the byte-level alphabet of CLIP's and Qwen's BPE)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def clip_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocab and merges of a tiny byte-level CLIP BPE: specials, 2x256 byte chars, pieces of :data:`CLIP_WORDS`."""
    alphabet = list(bytes_to_unicode().values())
    tokens = [*_CLIP_SPECIAL_TOKENS, *alphabet, *(c + "</w>" for c in alphabet)]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges: list[tuple[str, str]] = []
    for word in CLIP_WORDS:
        symbols = [*word[:-1], word[-1] + "</w>"]
        piece = symbols[0]
        for sym in symbols[1:]:
            merged = piece + sym
            if merged not in vocab:
                merges.append((piece, sym))
                vocab[merged] = len(vocab)
            piece = merged
    assert len(vocab) <= CLIP_VOCAB_SIZE, "the CLIP tokenizer's vocab must fit the SD text encoder's embedding table"
    return vocab, merges


def clip_tokenizer(model_max_length: int = 77) -> Any:
    """CLIP's byte-level BPE: ids 0 = bos, 1 = eos = pad."""
    from transformers import CLIPTokenizer

    vocab, merges = clip_vocab_and_merges()
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=model_max_length)  # type: ignore[arg-type]


def t5_tokenizer(model_max_length: int = 512) -> Any:
    """A T5 (SentencePiece unigram) tokenizer: 0 = pad, 1 = eos, 2 = unk, then words (``▁word``) and characters.
    Also what UMT5 encoders (Wan) take."""
    from transformers import T5TokenizerFast  # type: ignore[attr-defined]

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [("▁" + word, -1.0) for word in WORDS]
    pieces += [(char, -5.0) for char in "▁" + LETTERS]
    return T5TokenizerFast(vocab=pieces, extra_ids=0, model_max_length=model_max_length)


QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
"""Ids 0..6 of :func:`qwen2_tokenizer`: 0 = eos = pad (as in Qwen), then the chat and vision markers."""

# The system prompt of QwenImagePipeline's template, whose 34 leading tokens (up to and including "user\n") the
# pipeline drops (``prompt_template_encode_start_idx``): with these words whole, the prefix is 34 tokens here too.
_QWEN_TEMPLATE_WORDS = (
    "system Describe user assistant"
    " Ġthe Ġimage Ġby Ġdetailing Ġcolor Ġshape Ġsize Ġtexture Ġquantity Ġtext Ġspatial Ġrelationships Ġof"
    " Ġobjects Ġand Ġbackground"
).split()


def _learn_bpe(words: list[str]) -> list[tuple[str, str]]:
    """Merges that make every word of ``words`` (strings of base symbols) a single token.

    A plain BPE learner (most frequent adjacent pair first, ties broken by the pair's text): encoding a learned
    word replays its learning, so each word comes out as one token whatever words the learner saw with it.
    """
    corpus = [list(word) for word in dict.fromkeys(words) if len(word) > 1]
    merges: list[tuple[str, str]] = []
    while corpus:
        counts: dict[tuple[str, str], int] = {}
        for symbols in corpus:
            for pair in zip(symbols, symbols[1:], strict=False):
                counts[pair] = counts.get(pair, 0) + 1
        best = min(counts, key=lambda pair: (-counts[pair], pair))
        merges.append(best)
        for symbols in corpus:
            i = 0
            while i < len(symbols) - 1:
                if (symbols[i], symbols[i + 1]) == best:
                    symbols[i : i + 2] = [best[0] + best[1]]
                i += 1
        corpus = [symbols for symbols in corpus if len(symbols) > 1]
    return merges


def qwen2_tokenizer(model_max_length: int = 32768) -> Any:
    """A tiny byte-level BPE ``Qwen2Tokenizer`` (Qwen2 / Qwen2.5-VL's): ids 0..6 the :data:`QWEN_SPECIAL_TOKENS`,
    then the 256 byte symbols, then whole words (the test words, with and without a leading space, and the words
    of Qwen-Image's prompt template, so its dropped prefix is 34 tokens as with the real tokenizer). Pads right."""
    from transformers import Qwen2Tokenizer

    alphabet = list(bytes_to_unicode().values())
    words = [*_QWEN_TEMPLATE_WORDS, *WORDS, *("Ġ" + word for word in WORDS)]
    merges = _learn_bpe(words)
    vocab = {tok: i for i, tok in enumerate([*QWEN_SPECIAL_TOKENS, *alphabet])}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,  # type: ignore[arg-type]  # (left, right) pairs, as tokenizers' BPE takes them
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=list(QWEN_SPECIAL_TOKENS[1:]),
        model_max_length=model_max_length,
        padding_side="right",
    )
    return tokenizer


def gemma_tokenizer(model_max_length: int = 8192) -> Any:
    """A tiny ``GemmaTokenizer`` (BPE with byte fallback, spaces as ``▁``, bos added): 0 = pad, 1 = eos,
    2 = bos, 3 = unk, 4 = mask, 5..260 the byte-fallback tokens ``<0x00>``..``<0xFF>``, then ``▁`` and characters,
    then whole words (with and without a leading ``▁``). What Sana's Gemma2 text encoder takes."""
    from transformers import GemmaTokenizer

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    words = [*WORDS, *("▁" + word for word in WORDS)]
    merges = _learn_bpe(words)
    vocab = {tok: i for i, tok in enumerate([*specials, *byte_tokens, *"▁" + LETTERS])}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    return GemmaTokenizer(
        vocab=vocab,
        merges=merges,  # type: ignore[arg-type]  # (left, right) pairs, as tokenizers' BPE takes them
        add_bos_token=True,
        model_max_length=model_max_length,
    )


def vocab_size(tokenizer: Any) -> int:
    """Rows the text encoder's embedding table needs for ``tokenizer`` (a margin of 8)."""
    return len(tokenizer) + 8
