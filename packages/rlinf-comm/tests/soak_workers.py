"""Producer and consumer processes of the channel soak test (`test_soak.py`).

Run as ``python soak_workers.py ROLE STORE_ADDRESS SLOT GENERATION`` with the token in
``RLINF_COMM_TOKEN``. Both use rlinf.comm's public API only, and report through the store:

- a producer (endpoint ``producer-SLOT``: a restarted one takes over its dead
  predecessor's name) puts bursts of numbered items tagged ``SLOT.GENERATION``, flushes
  after each burst (so every item of the burst was consumed and released) and then records
  the burst's last number under ``acked/TAG``;
- a consumer (endpoint ``consumer-SLOT``) takes items one at a time, checks each payload,
  counts it under ``seen/TAG/SEQ`` before dropping it (so an item is released only once
  counted), and counts corrupt payloads and loss reports.

Both stop when ``stop`` is set in the store (a consumer once the channel is also empty).
"""

from __future__ import annotations

import logging
import random
import sys
import time

import numpy as np
import structlog

from rlinf.comm import (
    Batch,
    Channel,
    CommTimeoutError,
    Endpoint,
    PeerDiedError,
    TCPStore,
)

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))

CHANNEL = "soak"
SIZES = (64, 4096, 256 << 10)
"""Payload bytes: inline, small shared memory, large shared memory."""
PAUSE_S = 0.2
"""A producer pauses up to this long (uniform) after each acknowledged burst, so a kill lands
mid-burst, mid-flush or between bursts. Unpaced, a 60 s soak took 100 CPU-s (1.25 cores of
the 2-core dev machine) for 17.8k items; paced up to 50 ms, with kills every 1-5 s instead of
0.5-3 s (test_soak.py), 62 CPU-s for 7.1k items (2026-11-29). CI runs the soak beside the
other suites, whose CPU it takes: on the slower AVX2 host CI ran past its 90 minutes
(2026-12-02), so producers now pause up to 200 ms; the kills, what the soak is for, come as
often."""


def payload(seq: int, size: int) -> np.ndarray:
    return np.full(size, seq % 251, dtype=np.uint8)


def produce(store: TCPStore, slot: int, generation: int) -> None:
    tag = f"{slot}.{generation}"
    rng = random.Random(f"{tag}")
    with Endpoint(f"producer-{slot}", store=store) as me:
        channel = Channel.connect(CHANNEL, store=store, endpoint=me, timeout=60)
        seq = 0
        while not _stopped(store):
            for _ in range(rng.randint(1, 4)):
                batch = Batch({"x": payload(seq, rng.choice(SIZES))}, meta={"tag": tag, "seq": seq})
                channel.put(batch, timeout=60)
                seq += 1
            channel.flush(timeout=120)
            store.set(f"acked/{tag}", str(seq - 1).encode())
            time.sleep(rng.uniform(0.0, PAUSE_S))
        channel.disconnect()


def consume(store: TCPStore, slot: int, generation: int) -> None:
    with Endpoint(f"consumer-{slot}", store=store) as me:
        channel = Channel.connect(CHANNEL, store=store, endpoint=me, timeout=60)
        while True:
            try:
                batch = channel.get(timeout=0.5)
            except CommTimeoutError:
                if _stopped(store) and channel.qsize(timeout=10) == 0:
                    break
                continue
            except PeerDiedError:  # a killed producer's queued items: reported, not lost
                store.add("loss_reports")
                continue
            tag, seq = str(batch.meta["tag"]), int(batch.meta["seq"])
            x = batch["x"]
            if x.size not in SIZES or not np.all(x == seq % 251):
                store.add("corrupt")
            if store.add(f"seen/{tag}/{seq}") > 1:
                store.add("duplicates")
            del batch, x  # the release goes back to the producer only now
        channel.disconnect()


def _stopped(store: TCPStore) -> bool:
    try:
        store.get("stop", timeout=0)
    except CommTimeoutError:
        return False
    return True


def main() -> None:
    role, address, slot, generation = sys.argv[1:]
    with TCPStore(address, timeout=60) as store:
        {"producer": produce, "consumer": consume}[role](store, int(slot), int(generation))


if __name__ == "__main__":
    main()
