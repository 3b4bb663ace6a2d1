"""A character-level tokenizer for arithmetic tasks, built offline with `tokenizers`.

One token per printable ASCII character (digits, operators, '=', letters, punctuation,
space, newline) plus four special tokens, so prompts like ``"12+7="`` and completions like
``"19<eos>"`` tokenize without any download or training. It is a `PreTrainedTokenizerFast`,
so it saves and loads as a standard Hugging Face pair (``tokenizer.json`` +
``tokenizer_config.json``) that vLLM and `AutoTokenizer` accept.
"""

from __future__ import annotations

import os
import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

__all__ = ["ARITHMETIC_ALPHABET", "SPECIAL_TOKENS", "build_char_tokenizer", "load_tokenizer"]

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<unk>")
"""Special tokens in id order: pad = 0, bos = 1, eos = 2, unk = 3."""

# Printable ASCII minus the whitespace that never appears in prompts (tab, CR, VT, FF).
ARITHMETIC_ALPHABET: str = "".join(c for c in string.printable if c not in "\t\r\x0b\x0c")
"""Characters with their own token: digits first (ids 4..13), then letters, punctuation,
space and newline — 96 characters, so the vocabulary has 100 entries."""


def build_char_tokenizer(alphabet: str = ARITHMETIC_ALPHABET) -> PreTrainedTokenizerFast:
    """A char-level `PreTrainedTokenizerFast` over `alphabet`; unknown characters → ``<unk>``.

    Ids are stable: the special tokens, then `alphabet` in order. Padding defaults to the
    left, as generation needs (the prompt ends where the response starts).
    """
    chars = list(dict.fromkeys(alphabet))  # de-duplicate, keep order
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *chars])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Every character is its own pre-token; [\s\S] also matches newline.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # join characters back without separators
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )


def load_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerFast:
    """Load a tokenizer saved with ``save_pretrained`` (no network access)."""
    loaded = PreTrainedTokenizerFast.from_pretrained(os.fspath(path), local_files_only=True)
    return loaded
