"""The char-level arithmetic tokenizer: stable ids, round trips, padding, save/load."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from rlinf.workers.models import SPECIAL_TOKENS, build_char_tokenizer, load_tokenizer


def test_ids_are_stable_and_char_level() -> None:
    tok = build_char_tokenizer()
    # 4 specials + 96 printable characters
    assert len(tok) == 100
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == list(SPECIAL_TOKENS)
    # digits follow the specials: '1' = 4 + 1, '2' = 4 + 2; then 52 letters, then punctuation
    # in string.punctuation order: '+' is its 10th (0-based) -> 4 + 10 + 52 + 10 = 76,
    # '=' its 18th -> 4 + 62 + 18 = 84
    assert tok("12+7=")["input_ids"] == [5, 6, 76, 11, 84]


def test_decode_round_trip_and_unknown() -> None:
    tok = build_char_tokenizer()
    text = "What is 12 * (3 - 4)?\nAnswer: -12"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.decode(tok("1é")["input_ids"]) == "1<unk>"
    ids = tok("19")["input_ids"] + [tok.eos_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == "19"


def test_left_padding_for_generation() -> None:
    tok = build_char_tokenizer()
    batch = tok(["1+1=", "12+7="], padding=True, return_tensors="pt")
    assert batch["input_ids"].tolist() == [[0, 5, 76, 5, 84], [5, 6, 76, 11, 84]]
    assert batch["attention_mask"].tolist() == [[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]


def test_save_load_round_trip(tmp_path: Path) -> None:
    tok = build_char_tokenizer()
    tok.save_pretrained(tmp_path)
    texts = ["3*4=12\n", "hello, world"]
    for loaded in (load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(tmp_path)):
        assert loaded(texts)["input_ids"] == tok(texts)["input_ids"]
        assert loaded.eos_token_id == 2
        assert loaded.pad_token_id == 0
        assert loaded.padding_side == "left"
