"""Byte-level tokenizers built offline with ``tokenizers``: a pure byte one for tiny models, BPE for trained ones."""

from __future__ import annotations

import functools
from collections.abc import Iterable

SPECIALS = ("<pad>", "<s>", "</s>")


def _wrap(tok):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def _byte_level(tok):
    from tokenizers import decoders, pre_tokenizers

    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def byte_tokenizer():
    """259 tokens: 3 specials then the 256 bytes. Lossless on any text."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    return _wrap(_byte_level(Tokenizer(models.BPE(vocab=vocab, merges=[]))))


def train_bpe(texts: Iterable[str], vocab_size: int):
    """A byte-level BPE trained on ``texts`` (deterministic for the same input order)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = _byte_level(Tokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return _wrap(tok)


def leading_specials(tok) -> list[int]:
    """The ids a tokenizer puts before a text by default (``[bos]`` for Llama-style tokenizers, often none); found
    once per tokenizer, as every encoded row asks."""
    return list(_leading_specials(tok))


@functools.lru_cache(maxsize=8)
def _leading_specials(tok) -> tuple[int, ...]:
    bare = tok("a", add_special_tokens=False)["input_ids"]
    full = tok("a", add_special_tokens=True)["input_ids"]
    for k in range(len(full) - len(bare) + 1):
        if full[k:k + len(bare)] == bare:
            return tuple(full[:k])
    return ()
