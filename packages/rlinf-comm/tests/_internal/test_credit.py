"""Tests of rlinf.comm._internal.credit: room granted in a shared word, and a handle's count."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from rlinf.comm._internal import futex
from rlinf.comm._internal.credit import WANT_AFTER_S, Credits, CreditWord
from rlinf.comm.errors import ChannelClosedError

pytestmark = pytest.mark.skipif(not futex.available(), reason="needs futexes")


def test_the_owner_grants_in_the_word_and_nothing_stays_in_dev_shm() -> None:
    producer = CreditWord.create()
    assert producer is not None
    owner = CreditWord.attach(producer.offer())
    assert owner is not None
    producer.unlink()  # both mapped it: the name can go
    assert not Path("/dev/shm", producer.name).exists()
    owner.add(3)
    assert producer.load() == 3
    owner.add(2**32 - 1)  # wraps
    assert producer.load() == 2
    owner.close()
    producer.close()


def test_words_are_private_to_their_owner() -> None:
    producer = CreditWord.create()
    assert producer is not None
    mode = os.stat(Path("/dev/shm", producer.name)).st_mode & 0o777
    assert mode == 0o600
    producer.close()
    assert not Path("/dev/shm", producer.name).exists()


@pytest.mark.parametrize("offer", [None, {}, {"segment": "../etc/passwd"},
                                   {"segment": "rlinf-" + "0" * 32}])
def test_an_owner_that_cannot_map_the_word_says_so(offer: object) -> None:
    assert CreditWord.attach(offer) is None  # another node's word, or garbage


def test_credits_granted_in_answers_are_taken_refunded_and_given_back() -> None:
    credits = Credits(bounded=True)
    assert not credits.take(1)
    credits.add(3)
    assert credits.take(2) and not credits.take(2)
    credits.refund(2)
    assert credits.give_back() == 3 and not credits.take(1)
    assert not credits.wait_for_one(time.monotonic() + 5, check=lambda: None,
                                    ask=lambda: None)  # no word: nothing to wait on
    assert Credits(bounded=False).take(10**6)  # unbounded channel: always room


def test_credits_in_a_word_wait_for_the_owner() -> None:
    word = CreditWord.create()
    assert word is not None
    owner = CreditWord.attach(word.offer())
    assert owner is not None
    word.unlink()
    credits = Credits(bounded=True)
    credits.add(1)  # granted in an answer before the word was attached: still counts
    credits.attach(word)
    assert credits.take(1) and not credits.take(1)
    asked: list[float] = []
    started = time.monotonic()

    def ask() -> None:
        asked.append(time.monotonic() - started)

    # Nothing comes: the owner is told once, after a while, and the wait ends at the deadline.
    assert not credits.wait_for_one(started + 0.05, check=lambda: None, ask=ask)
    assert len(asked) == 1 and asked[0] >= WANT_AFTER_S
    # A grant from another thread wakes the waiter.
    threading.Timer(0.05, owner.add, args=(2,)).start()
    assert credits.wait_for_one(time.monotonic() + 30, check=lambda: None, ask=ask)
    assert credits.take(1) and not credits.take(1)
    owner.add(4)
    credits.add(2)
    assert credits.give_back() == 6 and not credits.take(1)  # the word's and the answers'

    owner.add(1)  # granted after the give-back: spendable
    assert credits.take(1)
    credits.refund(1)
    assert credits.take(1)

    def closed() -> None:
        raise ChannelClosedError("closed")

    with pytest.raises(ChannelClosedError):
        credits.wait_for_one(time.monotonic() + 30, check=closed, ask=ask)
    owner.close()
    credits.close()
